#!/usr/bin/env python3
"""Greedy set cover over a libFuzzer merge control file (docs/fuzzing.md): inputs that keep
every coverage edge of the merged corpus, or, given MAX_INPUTS, the most edges that many
inputs keep. Usage: setcover.py CONTROL_FILE OUT_DIR [MAX_INPUTS]"""
import os, shutil, sys
control, out = sys.argv[1], sys.argv[2]
lines = open(control).read().split('\n')
n = int(lines[0]); files = lines[2:2 + n]
cov = {}
for line in lines[2 + n:]:
    parts = line.split()
    if len(parts) >= 2 and parts[0] == 'COV':
        cov[int(parts[1])] = set(parts[2:])
universe = set().union(*cov.values()) if cov else set()
chosen, covered = [], set()
limit = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 30
while covered != universe and len(chosen) < limit:
    best = max(cov, key=lambda i: (len(cov[i] - covered), -os.path.getsize(files[i])))
    gain = cov[best] - covered
    if not gain:
        break
    chosen.append(best); covered |= gain
os.makedirs(out, exist_ok=True)
for i in chosen:
    shutil.copy(files[i], os.path.join(out, os.path.basename(files[i])))
print(f"{len(chosen)} inputs keep {len(covered)} of {len(universe)} edges")
