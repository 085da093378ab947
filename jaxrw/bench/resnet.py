"""ResNet-50 inference (NHWC, bottleneck blocks, batch norm with running statistics).

Convolutions and pooling are opaque to jaxrw; what is around them (batch-norm arithmetic,
residual adds) is not. The hand-optimized version folds each batch norm into the preceding
convolution's weights and bias once, outside the timed call.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from .case import Rand


@dataclass(frozen=True)
class ResNetConfig:
    batch: int
    image: int
    width: int  # channels of the first stage (64 in ResNet-50)
    blocks: tuple[int, ...]  # bottleneck blocks per stage ((3, 4, 6, 3) in ResNet-50)
    classes: int


def _conv(x, w, stride=1):
    return lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _bn(x, p, eps=1e-5):
    return (x - p["mean"]) / jnp.sqrt(p["var"] + eps) * p["scale"] + p["bias"]


def _conv_params(r: Rand, k: int, cin: int, cout: int, gamma: float = 1.0) -> dict:
    w = r.normal(k, k, cin, cout, scale=(2.0 / (k * k * cin)) ** 0.5)
    bn = {
        "scale": r.positive(cout, low=0.5 * gamma, high=1.5 * gamma),
        "bias": r.normal(cout, scale=0.1),
        "mean": r.normal(cout, scale=0.1),
        "var": r.positive(cout),
    }
    return {"w": w, "bn": bn}


def resnet_params(cfg: ResNetConfig, r: Rand) -> dict:
    p = {"stem": _conv_params(r, 7, 3, cfg.width), "stages": []}
    cin = cfg.width
    for s, n in enumerate(cfg.blocks):
        width = cfg.width * 2**s
        stage = []
        for b in range(n):
            blk = {
                "c1": _conv_params(r, 1, cin, width),
                "c2": _conv_params(r, 3, width, width),
                "c3": _conv_params(r, 1, width, 4 * width, gamma=0.2),
            }
            if b == 0:
                blk["sc"] = _conv_params(r, 1, cin, 4 * width)
            stage.append(blk)
            cin = 4 * width
        p["stages"].append(stage)
    p["fc_w"], p["fc_b"] = r.weight(cin, cin, cfg.classes), r.normal(cfg.classes, scale=0.1)
    return p


def _maxpool(x):
    return lax.reduce_window(x, jnp.asarray(-jnp.inf, x.dtype), lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def resnet(params, x, conv_bn=None):
    """Logits for images x: (batch, height, width, 3). `conv_bn(x, p, stride)` is the conv + norm
    (default: convolution then batch norm as written)."""
    cb = conv_bn or (lambda x, p, stride: _bn(_conv(x, p["w"], stride), p["bn"]))
    x = _maxpool(jax.nn.relu(cb(x, params["stem"], 2)))
    for s, stage in enumerate(params["stages"]):
        for b, blk in enumerate(stage):
            stride = 2 if (b == 0 and s > 0) else 1
            h = jax.nn.relu(cb(x, blk["c1"], 1))
            h = jax.nn.relu(cb(h, blk["c2"], stride))
            h = cb(h, blk["c3"], 1)
            sc = cb(x, blk["sc"], stride) if "sc" in blk else x
            x = jax.nn.relu(h + sc)
    x = jnp.mean(x, axis=(1, 2))
    return x @ params["fc_w"] + params["fc_b"]


def fold_bn(params: dict) -> dict:
    """Each conv's batch norm folded into its weights and a bias (computed in float32)."""

    def fold(p):
        bn = {k: v.astype(jnp.float32) for k, v in p["bn"].items()}
        s = bn["scale"] / jnp.sqrt(bn["var"] + 1e-5)
        dt = p["w"].dtype
        return {
            "w": (p["w"].astype(jnp.float32) * s).astype(dt),
            "b": (bn["bias"] - bn["mean"] * s).astype(dt),
        }

    out = {"stem": fold(params["stem"]), "fc_w": params["fc_w"], "fc_b": params["fc_b"]}
    out["stages"] = [[{k: fold(v) for k, v in blk.items()} for blk in stage] for stage in params["stages"]]
    return out


def resnet_folded(params, x):
    """The hand-optimized forward pass on folded parameters: conv plus bias."""
    return resnet(params, x, conv_bn=lambda x, p, stride: _conv(x, p["w"], stride) + p["b"])
