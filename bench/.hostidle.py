# host time per warm call: the idle-warpgroup form (16 new tokens) against the two-warpgroup form (80)
import time, torch, statistics
from prefix_prefill import prefix_prefill, finish_compiles
torch.manual_seed(0)
def case(n, layout):
    h, hk, d, page, ctx = 8, 2, 128, 16, 16
    nb = 8
    if layout == "split":
        kc = torch.randn(nb, hk, d // 8, page, 8, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(nb, hk, d, page, device="cuda", dtype=torch.bfloat16)
    else:
        kc = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(nb, page, hk, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(n, hk, d, device="cuda", dtype=torch.bfloat16)
    bt = torch.arange(nb, dtype=torch.int32, device="cuda")[None]
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    sl = torch.tensor([ctx + n], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    return lambda: prefix_prefill(q, k, v, kc, vc, bt, cu, sl, n, kv_layout=layout, out=out)
fns = {f"{lay}_{n}": case(n, lay) for lay in ("nhd", "split") for n in (16, 80)}
for f in fns.values():
    f(); torch.cuda.synchronize()
finish_compiles()
for f in fns.values():
    for _ in range(300): f()
torch.cuda.synchronize()
res = {k: [] for k in fns}
for r in range(7):
    for name, f in fns.items():
        t0 = time.perf_counter()
        for _ in range(2000): f()
        res[name].append((time.perf_counter() - t0) / 2000 * 1e6)
        torch.cuda.synchronize()
for name, ts in res.items():
    print(f"{name}: best {min(ts):.2f} us median {statistics.median(ts):.2f} us")
