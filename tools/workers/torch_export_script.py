"""The fixed parts of the standalone repro.py that tools/workers/torch_export.py writes: helpers,
the float64 reference in plain PyTorch (attest's mask and score rules, docs/semantics.md, dense
and packed batches), the kernel's run and the comparison, and main() for each kind of finding
the script reproduces:
  accuracy       o, lse or a gradient against the float64 reference at attest's worst location;
  gqa-mha        the GQA call against the MHA call with k and v repeated per group;
  determinism    two identical calls, byte for byte;
  kernel-error   the call (forward, or forward and backward) raises: the script prints the
                 exception and exits 1 while it is raised.
"""

HELPERS = '''def _values(values, shape, dtype):
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


def _mask(bits, shape):
    return torch.tensor([c == "1" for c in bits], dtype=torch.bool).reshape(shape)


def resolve(name, path):
    """MODULE:FUNCTION, imported with `path` first on sys.path."""
    module, _, qualname = name.partition(":")
    sys.path[:0] = [p for p in path if p not in sys.path]
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def print_environment():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {cudnn}, GPU {gpu}, {platform.platform()}")'''

REFERENCE = '''def sequences():
    """[(q_begin, q_len, k_begin, k_len)] per sequence: along the batch axis of a dense batch,
    along the token axis of a packed one (cu_seqlens)."""
    p = PROBLEM
    b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
    cq, ck = p.get("cu_seqlens_q"), p.get("cu_seqlens_k")
    if cq is not None:
        return [(cq[i], cq[i + 1] - cq[i], ck[i], ck[i + 1] - ck[i]) for i in range(b)]
    return [(i, sq, i, sk) for i in range(b)]


def visible(b, sq, sk, device):
    """Boolean [sq, sk]: may query i of sequence b see key j, under the case's mask rules
    (attest's docs/semantics.md; reference/problem/mask.h): the causal and window band around
    the diagonal i + off (off = sk - sq aligned bottom-right, 0 top-left), a prefix every query
    sees, then documents and blocks."""
    p = PROBLEM
    off = sk - sq if p.get("causal_align", "bottom_right") == "bottom_right" else 0
    left, right = p.get("window") or [-1, -1]
    if p.get("causal"):
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    band = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        band &= j >= i + off - left
    if right >= 0:
        band &= j <= i + off + right
    vis = band | (j < (p.get("prefix_lm") or 0))
    if p.get("document_ids_q") is not None:
        dq = torch.tensor(p["document_ids_q"][b], device=device)[:, None]
        dk = torch.tensor(p["document_ids_k"][b], device=device)[None, :]
        vis &= dq == dk
    sparse = p.get("block_sparse")
    if sparse is not None:
        bq, bk = sparse["block_q"], sparse["block_k"]
        allowed = torch.zeros((sq + bq - 1) // bq + 1, (sk + bk - 1) // bk + 1,
                              dtype=torch.bool, device=device)
        for qb, kb in sparse["blocks"]:
            if qb < allowed.shape[0] and kb < allowed.shape[1]:
                allowed[qb, kb] = True
        vis &= allowed[i // bq, j // bk]
    return vis


def attend(qs, ks, vs, b):
    """float64 attention of one sequence b (qs [Sq, Hq, D], ks, vs [Sk, Hkv, D]): o [Sq, Hq,
    Dv], lse [Hq, Sq]. Query head h reads kv head h // (Hq / Hkv); the scores are scaled, then
    soft-capped (softcap * tanh(s / softcap)), then ALiBi adds -slope_h * |i + off - j|; a
    row that sees no key gives o = 0, lse = -inf."""
    p = PROBLEM
    r = qs.shape[1] // ks.shape[1]
    qh = qs.transpose(0, 1)
    kh = ks.transpose(0, 1).repeat_interleave(r, dim=0)
    vh = vs.transpose(0, 1).repeat_interleave(r, dim=0)
    scale = p["scale"] if p.get("scale") is not None else qs.shape[-1] ** -0.5
    s = (qh @ kh.transpose(-1, -2)) * scale
    sq, sk = s.shape[-2:]
    if p.get("softcap"):
        s = p["softcap"] * torch.tanh(s / p["softcap"])
    if p.get("alibi_slopes") is not None:
        off = sk - sq if p.get("causal_align", "bottom_right") == "bottom_right" else 0
        i = torch.arange(sq, device=qs.device)[:, None]
        j = torch.arange(sk, device=qs.device)[None, :]
        slopes = torch.tensor(p["alibi_slopes"], dtype=torch.float64, device=qs.device)
        s = s - slopes[:, None, None] * (i + off - j).abs().double()
    s = s.masked_fill(~visible(b, sq, sk, qs.device)[None], float("-inf"))
    m = s.amax(-1, keepdim=True) if sk > 0 else s.new_zeros(s.shape[:-1] + (1,))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    prob = e / torch.where(total > 0, total, torch.ones_like(total))
    return (prob @ vh).transpose(0, 1), (m + torch.log(total)).squeeze(-1)


def reference(q, k, v, do):
    """float64 attention in attest's layout (q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D]; packed
    [total, H, D] with cu_seqlens): o, lse ([B, Hq, Sq]; packed [Hq, total]) and, with do, the
    gradients by autograd."""
    q, k, v = (x.detach().double().requires_grad_(do is not None) for x in (q, k, v))
    packed = PROBLEM.get("cu_seqlens_q") is not None
    os_, ls = [], []
    for b, (q0, ql, k0, kl) in enumerate(sequences()):
        if packed:
            o, lse = attend(q[q0:q0 + ql], k[k0:k0 + kl], v[k0:k0 + kl], b)
        else:
            o, lse = attend(q[b], k[b], v[b], b)
        os_.append(o)
        ls.append(lse)
    if packed:
        o, lse = torch.cat(os_, 0), torch.cat(ls, 1)
    else:
        o, lse = torch.stack(os_), torch.stack(ls)
    out = {"o": o.detach(), "lse": lse.detach()}
    if do is not None:
        grads = torch.autograd.grad(o, (q, k, v), do.double(), allow_unused=True)
        for name, g, x in zip(("dq", "dk", "dv"), grads, (q, k, v)):
            out[name] = torch.zeros_like(x) if g is None else g
    return out


def run_kernel(call, fn, q, k, v, do, data, grads):
    """The kernel's outputs: o (and lse where the call returns one) under the adapter's grad
    mode (FORWARD_MODE: no_grad, or enable_grad where compiled flex needs it), as attest's
    forward ran; with `grads` the gradients by autograd through the same call with dO = do,
    as attest's backward ran."""
    def split(out):
        return out if HAS_LSE and not grads else (out, None)
    if not grads:
        with getattr(torch, FORWARD_MODE)():
            o, lse = split(call(fn, q, k, v, **data))
        return {"o": o, "lse": lse}
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o, _ = split(call(fn, q, k, v, **data))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad_outputs=do)
    return {"o": o.detach(), "dq": dq, "dk": dk, "dv": dv}


def compare(got, expected, allowed):
    """|got - expected| at the element attest reported (VERDICT["worst"]["flat"], the
    row-major index into the tensor in attest's layout), against attest's allowance there;
    the whole tensor's largest |error| is printed for information. True: the finding holds."""
    if got is None:
        print(f"{TENSOR}: the call returned none")
        return True
    if tuple(got.shape) != tuple(expected.shape):
        print(f"{TENSOR}: shape {list(got.shape)} where {list(expected.shape)} is expected")
        return True
    g = got.detach().double().cpu().contiguous().reshape(-1)
    e = expected.detach().double().cpu().contiguous().reshape(-1)
    both = torch.isfinite(g) & torch.isfinite(e)
    diff = torch.where(both, (g - e).abs(), torch.zeros_like(g))
    bad = (~both & ~((g == e) | (g.isnan() & e.isnan()))).sum().item()
    if g.numel() == 0:
        print(f"{TENSOR}: empty")
        return False
    at = int(diff.argmax())
    print(f"whole tensor: largest |error| {diff.max().item():.6g} at flat index {at}; "
          f"{bad} element(s) non-finite on one side only")
    worst = VERDICT["worst"]
    if worst is None:
        print(f"attest reported no location; the script compares the largest |error| with "
              f"{allowed:.6g}")
        return bad > 0 or diff.max().item() > allowed
    flat = worst["flat"]
    a, b = g[flat].item(), e[flat].item()
    same = a == b or (a != a and b != b)
    err = 0.0 if same else abs(a - b) if both[flat] else float("inf")
    print(f"{TENSOR} at {VERDICT['where']} (flat index {flat}): kernel {a!r}, expected {b!r}, "
          f"|error| {err:.6g}, allowed {allowed:.6g} ({VERDICT['policy']})")
    return not err <= allowed'''


def main_source(verdict, data_names, mha_names, wrap, prelude):
    """main() of the script for `verdict` (its check and tensor): the call with the Data
    tensors `data_names` (the MHA call's `mha_names`), the function through `wrap` (source
    over `fn`, or None) after the `prelude` statements."""
    data = "{" + ", ".join(f"{n!r}: t[{n!r}]" for n in data_names) + "}"
    mha = "{" + ", ".join(f"{n[4:]!r}: t[{n!r}]" for n in mha_names) + "}"
    check = verdict["check"]
    if check == "kernel-error":
        grads = (verdict.get("message") or "").startswith("backward")
    else:
        grads = verdict["tensor"] in ("dq", "dk", "dv")
    lines = ['def main():',
             '    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])',
             '    ap.add_argument("--fn", default=os.environ.get("ATTEST_REPRO_FN") or '
             'DEFAULT_FN,',
             '                    help="MODULE:FUNCTION called in the kernel\'s place '
             '(default: %(default)s)")',
             '    ap.add_argument("--path", action="append", default=[],',
             '                    help="a folder to import MODULE from")',
             '    ap.add_argument("--device", default=DEVICE)']
    if wrap is not None:
        lines += ['    ap.add_argument("--no-wrap", action="store_true",',
                  '                    help="call --fn as it is, not through the adapter\'s "',
                  f'                         "wrapper ({wrap}): for a stand-in that "',
                  '                         "runs eagerly")']
    lines += ['    args = ap.parse_args()',
             '    if args.fn is None:',
             '        ap.error(f"the kernel ({KERNEL}) is not importable by name: pass --fn '
             'MODULE:FUNCTION")',
             '    print_environment()',
             '    fn = resolve(args.fn, args.path + (FN_PATH if args.fn == DEFAULT_FN else []))',
             '    print(f"function: {args.fn}")']
    for statement in prelude:
        lines.append(f'    {statement}')
    if wrap is not None:
        lines += ['    if not args.no_wrap:',
                  f'        fn = {wrap}  # as the adapter calls it']
    lines += ['    t = load_inputs(args.device)',
              '    q, k, v, do = t["q"], t["k"], t["v"], t.get("do")',
              '    print(f"rule: {RULE}")',
              '    print(f"attest: {VERDICT[\'message\']}")']
    if check == "kernel-error":
        lines += [
            '    try:',
            f'        got = run_kernel(kernel_call, fn, q, k, v, do, {data}, {grads})',
            '        if args.device.startswith("cuda"):',
            '            torch.cuda.synchronize()',
            '    except Exception as e:  # the finding: the call raises',
            '        text = f"{type(e).__name__}: {e}".strip()',
            '        print("the call raised " + text.splitlines()[0][:300] +',
            '              (" ..." if "\\n" in text else ""))',
            '        # The same error: attest\'s exception class, or a subclass of it with the same',
            '        # message start (NotImplementedError, a missing kernel, is a RuntimeError).',
            '        kinds = [c.__name__ for c in type(e).__mro__]',
            '        same = ERROR_TYPE is None or kinds[0] == ERROR_TYPE or (',
            '            ERROR_TYPE in kinds and str(e).strip().startswith(ERROR_TEXT[:30]))',
            '        if not same:',
            '            print(f"not the error attest saw ({ERROR_TYPE}): cannot judge the "',
            '                  "finding (exit 2)")',
            '            return 2',
            '        print("FINDING REPRODUCES")',
            '        return 1',
            '    finite = all(torch.isfinite(x).all().item() for x in got.values()',
            '                 if x is not None)',
            '    print("the call answered without error" +',
            '          ("" if finite else " (with non-finite values)"))',
            '    print("finding does not reproduce")',
            '    return 0']
        return "\n".join(lines + _tail())
    lines += ['    try:',
              f'        got = run_kernel(kernel_call, fn, q, k, v, do, {data}, {grads})'
              '[TENSOR]',
              '    except Exception as e:  # not this finding: the call itself fails',
              '        print(f"the call raised {type(e).__name__}: {str(e).strip()[:300]}")',
              '        print("cannot judge the finding (exit 2)")',
              '        return 2']
    if check == "accuracy":
        lines += ['    expected = reference(q, k, v, do)[TENSOR]',
                  '    failed = compare(got, expected, VERDICT["allowed"])']
    elif check == "gqa-mha":
        lines += [
            '    # MHA: the same call with k and v repeated per group (query head h reads kv '
            'head',
            '    # h // r), then for dk and dv the sum over each group\'s query heads in '
            'float64.',
            '    r = q.shape[-2] // k.shape[-2]',
            '    k2, v2 = (x.repeat_interleave(r, dim=-2) for x in (k, v))',
            f'    other = run_kernel(kernel_call_mha, fn, q, k2, v2, do, {mha}, {grads})'
            '[TENSOR]',
            '    if TENSOR in ("dk", "dv"):',
            '        other = other.double().unflatten(-2, (other.shape[-2] // r, r)).sum(-2)',
            '    ref = reference(q, k, v, do)[TENSOR]',
            '    if VERDICT["worst"] is not None:',
            '        print(f"float64 reference there: '
            '{ref.contiguous().reshape(-1)[VERDICT[\'worst\'][\'flat\']].item()!r}")',
            '    failed = compare(got, other, VERDICT["allowed"])']
    else:  # determinism
        lines += [f'    again = run_kernel(kernel_call, fn, q, k, v, do, {data}, {grads})'
                  '[TENSOR]',
                  '    differ = (got.contiguous().view(-1).view(torch.uint8) != '
                  'again.contiguous().view(-1).view(torch.uint8)).sum().item()',
                  '    print(f"{TENSOR}: {differ} byte(s) differ between two identical calls")',
                  '    failed = differ > 0']
    lines += ['    print("FINDING REPRODUCES" if failed else "finding does not reproduce")',
              '    return 1 if failed else 0']
    return "\n".join(lines + _tail())


def _tail():
    return ['', '', 'if __name__ == "__main__":', '    sys.exit(main())']
