#!/usr/bin/env python3
"""Summarise `go test -bench -count=N` output: the median ns/op, B/op and
allocs/op per benchmark, as a Markdown table (stdin to stdout)."""
import re
import statistics
import sys

LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:\s+(\d+) B/op\s+(\d+) allocs/op)?")

runs = {}
for line in sys.stdin:
    m = LINE.match(line)
    if m:
        runs.setdefault(m.group(1), []).append(m.groups()[1:])

print("| benchmark | median ns/op | B/op | allocs/op | runs |")
print("| --- | ---: | ---: | ---: | ---: |")
for name, rs in runs.items():
    ns = statistics.median(float(r[0]) for r in rs)
    print(f"| {name} | {ns:.0f} | {rs[0][1] or '-'} | {rs[0][2] or '-'} | {len(rs)} |")
