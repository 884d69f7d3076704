"""attest's mask rules as a FlashAttention-4 `mask_mod` (CuTe DSL), for the masks that
`flash_attn.cute.flash_attn_func` has no argument for: documents, prefix-LM, block-sparse
lists, and top-left alignment with q_len != k_len (its `causal`/`window_size` are
bottom-right). With a mask_mod FlashAttention-4 ignores `causal` and `window_size`
(flash_attn/cute/interface.py `_resolve_causal_local_window`), so the mask_mod carries every
rule of the problem (docs/semantics.md section 3):

    (band or j < prefix) and same_document and listed_block,  band = causal and window,

in the sequence's own coordinates: FlashAttention-4 calls a mask_mod with the batch index,
the head, the query row and key column within the sequence, its seqlen info and the
`aux_tensors` (flash_attn/cute/mask.py `call_mask_mod`, flash-attn-4 4.0.0b36), each index a
one-element TensorSSA. Per-sequence values (the diagonal offset, document ids, the block table)
travel as int32 aux tensors; the rules' constants are closure values, which FlashAttention-4
hashes into its compile cache key (flash_attn/cute/utils.py `hash_callable`). Aux tensors are
padded past the sequence ends, since the last tile may evaluate the mask_mod on rows or columns
past them before the sequence bound masks those out.
"""

import cutlass
import cutlass.cute as cute
import torch
from flash_attn.cute import utils

import attest_worker as aw

_PAD = 512  # columns past a sequence's end that a tile may still evaluate


def mask_mod_for(p, device):
    """(mask_mod, aux_tensors) for problem `p` (dense or packed)."""
    seqs = aw.sequences(p)
    causal = bool(p.get("causal"))
    left, right = list(p.get("window") or [-1, -1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    prefix = int(p.get("prefix_lm") or 0)
    bottom_right = p.get("causal_align", "bottom_right") == "bottom_right"
    offs = torch.tensor([(kl - ql) if bottom_right else 0 for _, ql, _, kl in seqs],
                        dtype=torch.int32, device=device)
    lq = max([ql for _, ql, _, _ in seqs] + [1]) + _PAD
    lk = max([kl for _, _, _, kl in seqs] + [1]) + _PAD
    has_docs = p.get("document_ids_q") is not None
    doc_q = torch.full((len(seqs), lq), -1, dtype=torch.int32)
    doc_k = torch.full((len(seqs), lk), -2, dtype=torch.int32)
    if has_docs:
        for b, (_, ql, _, kl) in enumerate(seqs):
            doc_q[b, :ql] = torch.tensor(p["document_ids_q"][b][:ql], dtype=torch.int32)
            doc_k[b, :kl] = torch.tensor(p["document_ids_k"][b][:kl], dtype=torch.int32)
    sparse = p.get("block_sparse")
    has_sparse = sparse is not None
    bq = int(sparse["block_q"]) if has_sparse else 1
    bk = int(sparse["block_k"]) if has_sparse else 1
    table = torch.zeros((-(-lq // bq) + 1, -(-lk // bk) + 1), dtype=torch.int32)
    if has_sparse:
        for qb, kb in sparse["blocks"]:
            if qb < table.shape[0] and kb < table.shape[1]:
                table[qb, kb] = 1
    aux = [offs, doc_q.to(device), doc_k.to(device), table.to(device)]

    @cute.jit
    def attest_mask(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        off = utils.scalar_to_ssa(aux_tensors[0][batch[0]], cutlass.Int32)
        diag = m_idx + off
        keep = n_idx >= utils.scalar_to_ssa(0, cutlass.Int32)
        if cutlass.const_expr(left >= 0):
            keep = keep & (n_idx >= diag - utils.scalar_to_ssa(left, cutlass.Int32))
        if cutlass.const_expr(right >= 0):
            keep = keep & (n_idx <= diag + utils.scalar_to_ssa(right, cutlass.Int32))
        if cutlass.const_expr(prefix > 0):
            keep = keep | (n_idx < utils.scalar_to_ssa(prefix, cutlass.Int32))
        if cutlass.const_expr(has_docs):
            m_doc = utils.scalar_to_ssa(aux_tensors[1][batch[0], m_idx[0]], cutlass.Int32)
            n_doc = utils.scalar_to_ssa(aux_tensors[2][batch[0], n_idx[0]], cutlass.Int32)
            keep = keep & (m_doc == n_doc)
        if cutlass.const_expr(has_sparse):
            listed = utils.scalar_to_ssa(aux_tensors[3][m_idx[0] // bq, n_idx[0] // bk],
                                         cutlass.Int32)
            keep = keep & (listed != utils.scalar_to_ssa(0, cutlass.Int32))
        return keep

    return attest_mask, aux
