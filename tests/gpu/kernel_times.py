"""Where a GPU run's time goes: reads the CSV of
`ncu --csv --metrics gpu__time_duration.sum --print-summary per-kernel`
(stdin) and prints the kernels by total time (invocations x average), with
each one's share, largest first. Used by tests/gpu/run.sh."""
import csv
import sys

UNIT = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3,
        "ms": 1e-3, "second": 1.0, "s": 1.0}


def main():
    lines = [l for l in sys.stdin if l.startswith('"')]  # ncu's own log lines are not CSV
    rows = list(csv.DictReader(lines))
    if not rows:
        print("kernel_times: no CSV rows in ncu's output")
        return 1
    key = lambda part: next(k for k in rows[0] if part in k)
    name, inv, avg, unit = key("Kernel Name"), key("Invocations"), key("Average"), key("Unit")
    total = {}
    for r in rows:
        try:
            t = float(r[avg].replace(",", "")) * UNIT.get(r[unit], 1e-9) * int(r[inv])
        except ValueError:
            continue
        k = r[name].split("(")[0][:70]
        n, s = total.get(k, (0, 0.0))
        total[k] = (n + int(r[inv]), s + t)
    all_s = sum(s for _, s in total.values())
    print(f"{'kernel':70} {'calls':>7} {'total ms':>10} {'share':>7}")
    for k, (n, s) in sorted(total.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"{k:70} {n:7d} {1e3 * s:10.2f} {100 * s / all_s:6.1f}%")
    print(f"{'all kernels':70} {sum(n for n, _ in total.values()):7d} {1e3 * all_s:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
