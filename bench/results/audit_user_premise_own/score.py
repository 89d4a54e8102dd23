"""Audit figures for a bench answer JSON from judged sentences (earlier audits + new judgements)."""
import json, re, sys, math
from cmp import units  # noqa: E402 (cmp.py beside this file)
def key(q, s): return (q, re.sub(r'\W+', ' ', s).strip().lower()[:120])
judged = {}
for f in sys.argv[2:]:
    for l in open(f):
        r = json.loads(l); judged[key(r['id'], r['sentence'])] = r
d = json.load(open(sys.argv[1])); rows = d.get('answers') or d.get('rows')
n = t = sup = miss = 0; half = {True: [0, 0], False: [0, 0]}
for r in rows:
    if r.get('outcome') != 'answered': continue
    for u in units(r.get('answer')):
        j = judged.get(key(r['id'], u))
        if j is None: miss += 1; print('UNJUDGED', r['id'], u[:150]); continue
        n += 1; ok = j['supported'] is True and j['answering'] is True; t += ok; sup += j['supported'] is True
        h = bool(j.get('heldout')); half[h][0] += ok; half[h][1] += 1
def wilson(k, n, z=1.96):
    p = k/n; d = 1+z*z/n; c = (p+z*z/(2*n))/d; w = z*math.sqrt(p*(1-p)/n+z*z/(4*n*n))/d
    return f"{k}/{n} = {p:.2f} [{c-w:.2f}, {c+w:.2f}]"
print('supported&answering', wilson(t, n), 'supported', wilson(sup, n), 'unjudged', miss)
print('held out', wilson(*half[True]), 'tuned', wilson(*half[False]))
