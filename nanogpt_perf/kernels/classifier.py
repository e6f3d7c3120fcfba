"""llm.c's fused classifier in Triton. One program per row of the logits (N, V) reads the row twice:
once for its maximum and sum of exponentials (online, a block of columns at a time), once to
overwrite it with the gradient of the row's cross-entropy, softmax - onehot. The row's loss is
written aside. The logits stay in their own dtype (bf16 in training) and every sum is in fp32, so
the loss and its gradient cost one read, one read-and-write of the logits and nothing else: no fp32
copy, no separate softmax, no zeros for the one-hot."""

import torch
import triton
import triton.language as tl

MAX_BLOCK = 4096  # columns a program holds at once: 16 fp32 values a thread at 8 warps


@triton.jit
def _tanh(u):
    # triton.language has no tanh; this one saturates cleanly at +-1
    return 2.0 * tl.sigmoid(2.0 * u) - 1.0


@triton.jit
def cross_entropy_rows_kernel(
    logits_ptr,
    targets_ptr,
    losses_ptr,
    n_cols,
    row_stride,
    softcap,
    ignore_index,
    BLOCK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index
    # before pass 2 overwrites it
    z_target = tl.load(row_ptr + tl.where(valid, target, 0)).to(tl.float32)
    if SOFTCAP:
        z_target = softcap * _tanh(z_target / softcap)

    m = tl.full((), float("-inf"), tl.float32)  # the running maximum and sum of exp(z - m)
    s = tl.full((), 0.0, tl.float32)
    for start in tl.range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        z = tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        if SOFTCAP:
            z = softcap * _tanh(z / softcap)
        z = tl.where(cols < n_cols, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(losses_ptr + row, tl.where(valid, lse - z_target, 0.0))

    if WRITE_GRAD:
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            if SOFTCAP:
                tanh = _tanh(z / softcap)
                z = softcap * tanh
            grad = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)
            if SOFTCAP:
                grad = grad * (1.0 - tanh * tanh)  # d(c tanh(z / c))/dz
            grad = tl.where(valid, grad, 0.0)
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=cols < n_cols)


def launch_config(n_cols: int) -> dict[str, int]:
    block = min(MAX_BLOCK, triton.next_power_of_2(n_cols))
    return {"BLOCK": block, "num_warps": 8 if block >= 2048 else 4}


def cross_entropy_in_place(
    logits: torch.Tensor,
    targets: torch.Tensor,
    softcap: float = 0.0,
    with_grad: bool = True,
    ignore_index: int = -1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's cross-entropy (float32; 0 where the target is ignore_index) of logits (N, V),
    capped as softcap * tanh(logits / softcap) when softcap > 0, and with_grad its gradient over the
    logits in place (softmax - onehot through the cap, in the logits' dtype; 0 on ignored rows),
    returned as well: (losses, logits or None)."""
    n, v = logits.shape
    if logits.stride(1) != 1 or targets.shape != (n,):
        raise ValueError(
            f"logits (N, V) with contiguous rows and targets (N,), not {logits.shape} and "
            f"{targets.shape}"
        )
    losses = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        cross_entropy_rows_kernel[(n,)](
            logits, targets, losses, v, logits.stride(0), float(softcap), ignore_index,
            SOFTCAP=softcap > 0, WRITE_GRAD=with_grad, **launch_config(v),
        )  # fmt: skip
    return losses, logits if with_grad else None
