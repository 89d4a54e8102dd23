"""Compare two bench answer JSONs: changed quote lines per question, with earlier judgements."""
import json, re, sys
def load(p):
    d = json.load(open(p))
    rows = d.get('answers') or d.get('rows')
    return {r['id']: r for r in rows}
def units(ans):
    out = []
    for line in (ans or '').split('\n'):
        line = line.strip()
        if not line: continue
        if line.startswith('- '):
            out.append(line[2:])
        else:
            out += [s for s in re.split(r'(?<=[.!?\]])\s+(?=[A-Z"“])', line) if re.search(r'\[\d', s)]
    return out
if __name__ == '__main__':
    judged = {}
    for f in sys.argv[3:]:
        for l in open(f):
            r = json.loads(l)
            judged[(r['id'], re.sub(r'\W+', ' ', r['sentence']).strip().lower()[:120])] = r
    b, a = load(sys.argv[1]), load(sys.argv[2])
    changed = 0
    for q in b:
        ub, ua = units(b[q].get('answer')), units(a[q].get('answer'))
        if ub == ua and b[q].get('outcome') == a[q].get('outcome'): continue
        changed += 1
        print(f"== {q} [{b[q].get('outcome')} -> {a[q].get('outcome')}] {b[q]['question']}")
        for u in ub:
            if u not in ua:
                j = judged.get((q, re.sub(r'\W+', ' ', u).strip().lower()[:120]))
                print('   -', (j or {}).get('answering'), u[:300])
        for u in ua:
            if u not in ub:
                j = judged.get((q, re.sub(r'\W+', ' ', u).strip().lower()[:120]))
                print('   +', (j or {}).get('answering'), u[:300])
    print('changed', changed, 'of', len(b))
