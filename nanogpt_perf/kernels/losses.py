"""The losses that never make all the logits of lm_head at once, below model.py: the fused lm_head +
cross-entropy as one operator (torch.library.custom_op: torch.compile neither unrolls its chunks nor
keeps a partial per chunk), its softmax in torch or in a Triton kernel (classifier.py), and
liger-kernel's. They import torch, and nothing of the project; model.py's GPT.forward imports this
module only when GPTConfig.loss_impl asks for one (lm_head_loss)."""

from collections.abc import Callable

import torch
from torch.nn import functional as F


def wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype losses are computed in: float32, or float64 for float64 work (model.py's wide: the
    kernels import nothing of the project)."""
    return torch.promote_types(dtype, torch.float32)


def autocast_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a GEMM on x runs in: autocast's where it is on, else x's own."""
    return (
        torch.get_autocast_dtype(x.device.type)
        if torch.is_autocast_enabled(x.device.type)
        else x.dtype
    )


# The fused loss's chunks hold about this many bytes of logits each. On a GPU, few and large: each
# chunk's three GEMMs read the whole weight (finding 3 of the GPU review: 64 chunks of 512 rows at
# B=32 starve the GEMMs). On a CPU, under glibc's 32 MiB mmap threshold, so that malloc reuses a
# chunk's blocks for the next: larger ones are mapped afresh and page-faulted in each time, at ~1.5
# ms a MiB on the test machine, 5x the cost of writing them.
CHUNK_BYTES = {"cpu": 24 << 20, "other": 1 << 30}


def chunk_rows(n: int, vocab: int, device: torch.device, itemsize: int = 4) -> int:
    """Rows per chunk of the fused loss over n rows: the fewest chunks, all of about one size, whose
    (rows, vocab) logits of itemsize bytes each stay within the device's CHUNK_BYTES."""
    budget = CHUNK_BYTES["cpu" if device.type == "cpu" else "other"]
    chunks = max(1, -(-n * vocab * itemsize // budget))
    return max(1, -(-n // chunks))


@torch.library.custom_op("nanogpt::fused_linear_cross_entropy", mutates_args=())
def fused_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    rows: int,
    softcap: float,
    gemm_dtype: torch.dtype,
    use_triton: bool,
    needs_dx: bool,
    needs_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mean cross-entropy of the logits x @ weight.T (x: (N, C); targets of -1 ignored; capped
    at softcap when > 0) and, where needs_dx and needs_dw ask for them, its gradients for x and
    weight (else empty tensors).

    One operator, which torch.compile leaves whole: `rows` rows at a time, a chunk's logits become
    its losses and their gradient softmax - onehot (in torch, or in one Triton kernel over the
    logits in place), which two GEMMs in gemm_dtype turn into the chunk's rows of d/dx and its share
    of d/dweight, added in place to one wide buffer. At most one chunk of logits exists at a time,
    no GEMM runs twice, and the weight is cast once."""
    classify = triton_cross_entropy(x.device) if use_triton else cross_entropy_rows
    w = weight.to(gemm_dtype)
    dx = torch.empty_like(x) if needs_dx else x.new_empty(0)
    dw = torch.zeros_like(weight, dtype=wide(weight.dtype)) if needs_dw else weight.new_empty(0)
    total = torch.zeros((), dtype=wide(x.dtype), device=x.device)
    count = (targets != -1).sum()
    # the dtypes are chosen here, whatever the caller's autocast
    with torch.autocast(x.device.type, enabled=False):
        for start in range(0, x.size(0), rows):
            xc, tc = x[start : start + rows].to(gemm_dtype), targets[start : start + rows]
            losses, grad = classify(xc @ w.t(), tc, softcap, needs_dx or needs_dw)
            total += losses.sum()
            # an ignored row's gradient is zeroed in the (rows, C) operands
            valid = (tc != -1).unsqueeze(1)
            if needs_dx:
                mm_into(dx[start : start + rows], grad, w).mul_(valid / count.to(total.dtype))
            if needs_dw:
                addmm_into(dw, grad.t(), xc * valid)
    return total / count, dx, dw.div_(count).to(weight.dtype)


@fused_linear_cross_entropy.register_fake
def _fused_linear_cross_entropy_shapes(
    x, weight, targets, rows, softcap, gemm_dtype, use_triton, needs_dx, needs_dw
):
    dx = torch.empty_like(x) if needs_dx else x.new_empty(0)
    dw = torch.empty_like(weight) if needs_dw else weight.new_empty(0)
    return x.new_empty((), dtype=wide(x.dtype)), dx, dw


def _keep_gradients(ctx, inputs: tuple, output: tuple) -> None:
    _, dx, dw = output
    ctx.mark_non_differentiable(dx, dw)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(dx, dw)


def _scale_gradients(ctx, grad_loss: torch.Tensor, *_) -> tuple:
    # in place: nothing else holds them (a second backward is refused as modified)
    dx, dw = ctx.saved_tensors
    needs_dx, needs_dw = ctx.needs_input_grad[:2]
    return (
        dx.mul_(grad_loss) if needs_dx else None,
        dw.mul_(grad_loss) if needs_dw else None,
        *[None] * 7,
    )


fused_linear_cross_entropy.register_autograd(_scale_gradients, setup_context=_keep_gradients)


def cross_entropy_rows(
    logits: torch.Tensor, targets: torch.Tensor, softcap: float, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's cross-entropy of logits (rows, V), in a wide dtype (0 where the target is -1), and
    with_grad its gradient softmax - onehot in the logits' dtype (through the softcap; the rows of
    ignored targets are not zeroed). The logits are overwritten."""
    z = logits.to(wide(logits.dtype))  # logits itself when already wide
    if softcap:
        tanh = z.div_(softcap).tanh_()
        z = tanh * softcap
    logp = F.log_softmax(z, dim=1)
    del z
    target = targets.clamp(min=0).unsqueeze(1)
    losses = -logp.gather(1, target).squeeze(1) * (targets != -1)
    if not with_grad:
        return losses, None
    grad = logp.exp_().scatter_add_(1, target, torch.full_like(target, -1, dtype=logp.dtype))
    if softcap:
        grad.mul_(tanh.square_().neg_().add_(1))  # d(c tanh(z / c))/dz = 1 - tanh^2
    return losses, grad.to(logits.dtype)


def mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out = a @ b, where out may be wider than a and b."""
    return torch.mm(a, b, out=out) if out.dtype == a.dtype else out.copy_(a @ b)


def addmm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out += a @ b, where out may be fp32 and a, b bf16 or fp16: cuBLAS then adds onto out itself
    in fp32 (addmm's out_dtype, CUDA only); a CPU adds its product in a's dtype."""
    if out.dtype == a.dtype:
        return out.addmm_(a, b)
    if out.is_cuda:
        return torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
    return out.add_(a @ b)


def triton_cross_entropy(device: torch.device) -> Callable:
    """The Triton classifier of nanogpt_perf.kernels, imported only when loss_impl='triton' asks for
    it; ValueError on a device where it cannot run."""
    from nanogpt_perf.kernels import triton_problem

    if problem := triton_problem(device):
        raise ValueError(f"loss_impl='triton' cannot run here: {problem}")
    from nanogpt_perf.kernels.classifier import cross_entropy_in_place

    return cross_entropy_in_place


def lm_head_loss(
    impl: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """The mean cross-entropy of the logits x @ weight.T (targets of -1 ignored, capped at softcap
    when > 0) by the loss GPTConfig.loss_impl names: 'fused' or 'triton' (fused_cross_entropy, chunk
    rows at a time, its softmax in torch or Triton) or 'liger'."""
    if impl == "liger":
        return liger_cross_entropy(x, weight, targets, softcap)
    return fused_cross_entropy(x, weight, targets, chunk, softcap, use_triton=impl == "triton")


def fused_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = 0,
    softcap: float = 0.0,
    use_triton: bool = False,
) -> torch.Tensor:
    """The mean cross-entropy of the logits x @ weight.T over the rows of x (..., C) by the operator
    fused_linear_cross_entropy, chunk rows at a time (0: as few chunks as CHUNK_BYTES allows), each
    chunk's softmax in torch or, use_triton, in one Triton kernel. Its GEMMs run in the autocast
    dtype, as the plain path's do, and it makes only the gradients autograd will ask for: none under
    no_grad (eval), none for a frozen weight."""
    x, targets = x.reshape(-1, x.size(-1)), targets.reshape(-1)
    gemm_dtype = autocast_dtype(x)
    # the dtype its logits are worked in
    itemsize = gemm_dtype.itemsize if use_triton else wide(gemm_dtype).itemsize
    rows = chunk or chunk_rows(x.size(0), weight.size(0), x.device, itemsize)
    grad = torch.is_grad_enabled()
    needs = (grad and x.requires_grad, grad and weight.requires_grad)
    loss, _, _ = fused_linear_cross_entropy(
        x, weight, targets, rows, softcap, gemm_dtype, use_triton, *needs
    )
    return loss


def liger_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0
) -> torch.Tensor:
    """liger-kernel's fused linear cross-entropy (Triton, CUDA only; pip install liger-kernel), its
    inputs in the autocast dtype as the plain path's GEMM would take them."""
    if softcap:
        raise ValueError(
            "loss_impl='liger' is not run with a logit softcap here: use plain, fused or triton"
        )
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    dtype = autocast_dtype(x)
    x, targets = x.reshape(-1, x.size(-1)).to(dtype), targets.reshape(-1)
    return LigerFusedLinearCrossEntropyLoss(ignore_index=-1)(weight.to(dtype), x, targets)
