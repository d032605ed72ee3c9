#!/usr/bin/env python3
"""Interleaved A/B of grouplin binaries (two builds of different commits, say) on one machine.

    python3 bench/ab_binaries.py [--fp8] [--bench "ARGS"] ROUNDS base=PATH other=PATH [more=PATH ...]

Each round runs every binary's `grouplin bench` once, in a random order; per case it prints the
median GF/s of each binary and its ratio to the first one, then the median ratio over the cases.
With --fp8 the cases are `bench --dtype fp8`'s (1-16 rows per expert, forward and dgrad), each
given twice: FP8 GF/s, and that run's own FP8 weights / BF16 weights ratio ("fp8/bf16").
--bench replaces the default cases (`grouplin bench` flags; --json is added; with --fp8, it adds
to them: --bench "--fp8-rows 8,48"). A PATH may carry
flags of its own after a space, for one binary run two ways:

    python3 bench/ab_binaries.py --bench "--shapes qwen3 --rows 4096 --ops forward --dtype bf16" \
        5 plain=build/grouplin "packed=build/grouplin --pack-weights"
"""
import json, random, shlex, statistics, subprocess, sys
argv = sys.argv[1:]
fp8 = argv[0] == '--fp8'
argv = argv[1:] if fp8 else argv
bench_args = None
if argv[0] == '--bench':
    bench_args, argv = shlex.split(argv[1]), argv[2:]
rounds = int(argv[0])
bins = dict(a.split('=', 1) for a in argv[1:])
if fp8:
    args = ['bench', '--dtype', 'fp8', '--reps', '3', '--json'] + (bench_args or [])
elif bench_args is not None:
    args = ['bench'] + bench_args + ['--json']
else:
    args = ['bench', '--shapes', 'qwen3,mixtral,deepseek', '--rows', '256,4096', '--routing',
            'uniform', '--ops', 'forward,dgrad,wgrad', '--reps', '3', '--json']
res = {k: {} for k in bins}
rng = random.Random(7)
for r in range(rounds):
    for name in rng.sample(list(bins), len(bins)):
        binary, *own = shlex.split(bins[name])
        out = subprocess.run([binary] + args + own, check=True, capture_output=True,
                             text=True).stdout
        if fp8:
            for c in json.loads(out)['fp8']['results']:
                key = (c['shape'], c['rows_per_expert'], c['op'], 'fp8/bf16')
                res[name].setdefault(key, []).append(c['vs_bf16'])
                fkey = (c['shape'], c['rows_per_expert'], c['op'], 'fp8 GF/s')
                res[name].setdefault(fkey, []).append(c['fp8_gflops'])
            continue
        for c in json.loads(out)['results']:
            for dt in ('f32', 'bf16'):
                if dt not in c:
                    continue
                key = (c['shape'], c['rows'], c['routing'], c['op'], dt)
                res[name].setdefault(key, []).append(c[dt]['grouplin_gflops'])
    print('round', r, 'done', file=sys.stderr, flush=True)
names = list(bins)
base = names[0]
print('case', *[f'{n}' for n in names], *[f'{n}/{base}' for n in names[1:]], sep=' | ')
ratios = {n: [] for n in names[1:]}
for key in sorted(res[base]):
    med = {n: statistics.median(res[n][key]) for n in names}
    row = [' '.join(map(str, key))] + [f'{med[n]:.2f}' for n in names]
    for n in names[1:]:
        ratios[n].append(med[n] / med[base]); row.append(f'{med[n] / med[base]:.2f}')
    print(*row, sep=' | ')
for n in names[1:]:
    v = sorted(ratios[n])
    print(f'{n}/{base}: median {statistics.median(v):.3f}, min {v[0]:.2f}, max {v[-1]:.2f}, {len(v)} cases')
