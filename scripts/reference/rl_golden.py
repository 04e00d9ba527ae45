#!/usr/bin/env python3
"""Independent PyTorch reference for ooze's RL math (shared/reference/algorithms.md): advantage
estimators, aggregation weights and the loss terms with their gradients, on fixed seeded inputs.
Writes one JSON file that crates/ooze-algo/tests/golden.rs compares against (within 1e-6).

The inputs are a step of 11 samples in 4 prompt groups of uneven size, with a rollout that fans out
into three sibling samples, masked (tool) tokens inside responses, and every per-token stream the
math uses. Advantages are computed in float64, losses in float32, gradients by autograd.

Usage: rl_golden.py OUT.json
"""
import json
import sys

import numpy as np
import torch

rng = np.random.default_rng(20261121)

# (group, rollout, length); rollout 31 fans out into three siblings.
LAYOUT = [(1, 10, 5), (1, 11, 7), (1, 12, 4), (2, 20, 6), (2, 21, 3),
          (3, 30, 8), (3, 31, 4), (3, 31, 5), (3, 31, 6), (4, 40, 5), (1, 13, 9)]


def make_samples():
    samples = []
    rollout_reward = {}
    for group, rollout, n in LAYOUT:
        if rollout not in rollout_reward:
            rollout_reward[rollout] = float(rng.choice([0.0, 1.0, 0.5, -0.25]))
        mask = (rng.random(n) > 0.25).astype(np.float32)
        mask[0] = 1.0
        if n > 4:
            mask[-2] = 0.0  # a tool token near the end, so "last masked token" matters
        logp_old = -rng.random(n) * 2.0
        samples.append({
            "group": group, "rollout": rollout, "reward": rollout_reward[rollout],
            "mask": mask.tolist(),
            "logp_old": logp_old.tolist(),
            "logp_ref": (logp_old + rng.normal(0, 0.3, n)).tolist(),
            "logp_roll": (logp_old + rng.normal(0, 0.2, n)).tolist(),
            "logp_teacher": (logp_old + rng.normal(0, 0.5, n)).tolist(),
            "logp": (logp_old + rng.normal(0, 0.15, n)).tolist(),
            "values": rng.normal(0, 0.5, n).tolist(),
            "values_old": rng.normal(0, 0.5, n).tolist(),
            "entropy": (rng.random(n) * 3.0).tolist(),
            "observation_mask": (1.0 - mask).tolist(),
        })
    return samples


def kl_value(delta, estimator):
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return delta * delta / 2.0
    return torch.clamp(torch.exp(-delta) - 1.0 + delta, -10.0, 10.0)


def group_view(samples):
    """rollout reward (mean of its samples) and, per group, the list of rollout rewards."""
    by_rollout = {}
    for s in samples:
        by_rollout.setdefault((s["group"], s["rollout"]), []).append(s["reward"])
    groups = {}
    for (g, _), rs in by_rollout.items():
        groups.setdefault(g, []).append(sum(rs) / len(rs))
    return by_rollout, groups


def normalized(samples, divide):
    _, groups = group_view(samples)
    out = []
    for s in samples:
        rs = torch.tensor(groups[s["group"]], dtype=torch.float64)
        v = s["reward"] - rs.mean().item()
        if divide and len(rs) > 1:
            v = v / (rs.std(unbiased=True).item() + 1e-6)
        out.append(v)
    return out


def whiten(adv, masks):
    flat = torch.cat(adv)
    m = torch.cat(masks)
    mean = (flat * m).sum() / m.sum()
    var = (((flat - mean) ** 2) * m).sum() / (m.sum() - 1)
    return [(a - mean) / torch.sqrt(var + 1e-8) for a in adv]


def advantages(samples, cfg):
    est = cfg["estimator"]
    t = lambda k, s: torch.tensor(s[k], dtype=torch.float64)
    masks = [t("mask", s) for s in samples]
    kl = [kl_value(t("logp_old", s) - t("logp_ref", s), cfg["kl_estimator"]) if cfg["kl_coef"] else
          torch.zeros(len(s["mask"]), dtype=torch.float64) for s in samples]
    returns = None
    if est in ("grpo", "gspo", "cispo", "dr_grpo"):
        r = normalized(samples, cfg["std_normalization"] and est != "dr_grpo")
        adv = [torch.full((len(s["mask"]),), v, dtype=torch.float64) for s, v in zip(samples, r)]
    elif est == "rloo":
        by_rollout, groups = group_view(samples)
        adv = []
        for s in samples:
            rs = groups[s["group"]]
            own = sum(by_rollout[(s["group"], s["rollout"])]) / len(by_rollout[(s["group"], s["rollout"])])
            v = 0.0 if len(rs) < 2 else s["reward"] - (sum(rs) - own) / (len(rs) - 1)
            adv.append(torch.full((len(s["mask"]),), v, dtype=torch.float64))
    elif est == "reinforce_plus_plus":
        adv = []
        for s, m, k in zip(samples, masks, kl):
            r = -cfg["kl_coef"] * k * m
            last = int(torch.nonzero(m).max())
            r[last] += s["reward"]
            # discounted return as a matrix product: G = U r with U[i, j] = gamma^(j - i), j >= i
            n = len(r)
            i = torch.arange(n)
            powers = (i[None, :] - i[:, None]).clamp(min=0).to(torch.float64)
            u = torch.where(i[None, :] >= i[:, None], cfg["gamma"] ** powers, torch.zeros((), dtype=torch.float64))
            adv.append(u @ r)
    elif est == "reinforce_plus_plus_baseline":
        c = normalized(samples, False)
        adv = [v - cfg["kl_coef"] * k for v, k in zip(c, kl)]
    elif est == "ppo":
        adv, returns = [], []
        for s, k in zip(samples, kl):
            v = t("values", s)
            r = -cfg["kl_coef"] * k
            r[-1] += s["reward"]
            nxt = torch.cat([v[1:], torch.zeros(1, dtype=torch.float64)])
            delta = r + cfg["gamma"] * nxt - v
            n = len(r)
            i = torch.arange(n)
            powers = (i[None, :] - i[:, None]).clamp(min=0).to(torch.float64)
            gl = cfg["gamma"] * cfg["lambda"]
            u = torch.where(i[None, :] >= i[:, None], gl ** powers, torch.zeros((), dtype=torch.float64))
            a = u @ delta
            adv.append(a)
            returns.append(a + v)
    else:
        raise ValueError(est)
    if cfg["normalize_advantages"] or est in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        adv = whiten(adv, masks)
    if cfg["opd_coef"]:
        adv = [a - cfg["opd_coef"] * (t("logp_old", s) - t("logp_teacher", s)) for a, s in zip(adv, samples)]
    return adv, returns


def weights(samples, mode, mask_key="mask"):
    masks = [torch.tensor(s[mask_key], dtype=torch.float64) for s in samples]
    n = len(samples)
    if mode == "per_rollout_token_mean":
        tokens = {}
        for s, m in zip(samples, masks):
            tokens[s["rollout"]] = tokens.get(s["rollout"], 0.0) + m.sum().item()
        return [m / (max(tokens[s["rollout"]], 1.0) * len(tokens)) for s, m in zip(samples, masks)]
    if mode == "global_token_mean":
        total = sum(m.sum().item() for m in masks)
        return [m / max(total, 1.0) for m in masks]
    if mode == "seq_mean_token_sum":
        return [m / n for m in masks]
    if mode == "seq_mean_token_mean":
        return [m / (max(m.sum().item(), 1.0) * n) for m in masks]
    raise ValueError(mode)


def loss_case(samples, adv, cfg, mode):
    f = lambda key: torch.tensor([x for s in samples for x in s[key]], dtype=torch.float32)
    logp = f("logp").requires_grad_(True)
    entropy = f("entropy").requires_grad_(True)
    values = f("values").requires_grad_(True)
    old, roll, ref, mask = f("logp_old"), f("logp_roll"), f("logp_ref"), f("mask")
    a = torch.cat(adv).to(torch.float32)
    w = torch.cat(weights(samples, mode)).to(torch.float32)
    lengths = [len(s["mask"]) for s in samples]
    seg = torch.repeat_interleave(torch.arange(len(samples)), torch.tensor(lengths))

    def seq_sum(x):
        return torch.zeros(len(samples), dtype=x.dtype).scatter_add(0, seg, x)[seg]

    def seq_mean(x):
        return seq_sum(x * mask) / seq_sum(mask).clamp(min=1.0)

    eps_low = cfg["eps_low"]
    eps_high = cfg["eps_high"] if cfg.get("eps_high") is not None else eps_low
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    policy = cfg["policy"]
    if policy in ("ppo_clip", "gspo"):
        ratio = torch.exp(seq_mean(logp - old)) if policy == "gspo" else torch.exp(logp - old)
        pg1, pg2 = -ratio * a, -torch.clamp(ratio, lo, hi) * a
        per_token = torch.maximum(pg1, pg2)
        clipped = (pg2 > pg1).float()
        if cfg.get("dual_clip"):
            per_token = torch.where(a < 0, torch.minimum(per_token, -cfg["dual_clip"] * a), per_token)
    elif policy == "cispo":
        ratio = torch.exp(logp - old)
        per_token = -torch.clamp(ratio, lo, hi).detach() * a * logp
        clipped = ((ratio < lo) | (ratio > hi)).float()
    else:
        per_token = -logp
        clipped = torch.zeros_like(logp)
    out = {}
    imp = cfg.get("importance")
    if imp:
        log_w = old - roll
        if imp["level"] == "token":
            iw = torch.exp(log_w)
        elif imp["level"] == "sequence":
            iw = torch.exp(seq_sum(log_w * mask))
        else:
            iw = torch.exp(seq_mean(log_w))
        if imp["mode"] == "truncate":
            iw = torch.clamp(iw, imp["low"], imp["high"])
        else:
            iw = torch.where((iw >= imp["low"]) & (iw <= imp["high"]), iw, torch.zeros_like(iw))
        per_token = per_token * iw
        out["importance_weight"] = float((iw * w).sum().detach())
    pg = (per_token * w).sum()
    total = pg
    if cfg["kl_loss_coef"]:
        k = kl_value(logp - ref, cfg["kl_estimator"])
        if cfg["kl_unbiased"]:
            k = k * torch.exp(logp - old)
        kl = (k * w).sum()
        total = total + cfg["kl_loss_coef"] * kl
        out["kl"] = float(kl.detach())
    if cfg["entropy_coef"]:
        h = (entropy * w).sum()
        total = total - cfg["entropy_coef"] * h
        out["entropy"] = float(h.detach())
    rets = torch.cat(adv_returns_for_values(samples)).to(torch.float32)
    v_old = f("values_old")
    vc = v_old + torch.clamp(values - v_old, -cfg["value_clip"], cfg["value_clip"])
    vl = (torch.maximum((vc - rets) ** 2, (values - rets) ** 2) * w).sum()
    total = total + cfg["value_coef"] * vl
    out["value"] = float(vl.detach())
    if cfg["observation_coef"]:
        ow = torch.cat(weights(samples, "seq_mean_token_mean", "observation_mask")).to(torch.float32)
        o = (-logp * ow).sum()
        total = total + cfg["observation_coef"] * o
        out["observation"] = float(o.detach())
    total.backward()
    d = logp.detach() - old
    out.update({
        "total": float(total.detach()), "policy": float(pg.detach()), "clipfrac": float((clipped * w).sum()),
        "approx_kl": float(((torch.exp(-d) - 1 + d).clamp(-10, 10) * w).sum()),
        "grad_logp": logp.grad.tolist(),
        "grad_entropy": (entropy.grad if entropy.grad is not None else torch.zeros_like(entropy)).tolist(),
        "grad_values": values.grad.tolist(),
    })
    return out


def adv_returns_for_values(samples):
    """Value targets used by every loss case: ppo returns with γ 0.99, λ 0.95, no KL."""
    _, returns = advantages(samples, dict(ADV_BASE, estimator="ppo", gamma=0.99, **{"lambda": 0.95}))
    return returns


ADV_BASE = {"estimator": "grpo", "std_normalization": True, "gamma": 1.0, "lambda": 1.0, "kl_coef": 0.0,
            "kl_estimator": "k3", "normalize_advantages": False, "opd_coef": 0.0}
LOSS_BASE = {"policy": "ppo_clip", "eps_low": 0.2, "eps_high": None, "dual_clip": None, "importance": None,
             "kl_loss_coef": 0.0, "kl_estimator": "k3", "kl_unbiased": False, "entropy_coef": 0.0,
             "value_coef": 1.0, "value_clip": 0.2, "observation_coef": 0.0}


def write(path):
    samples = make_samples()
    adv_cases = [
        {}, {"std_normalization": False}, {"estimator": "dr_grpo"}, {"estimator": "rloo"},
        {"estimator": "gspo"}, {"estimator": "cispo"},
        {"estimator": "reinforce_plus_plus", "kl_coef": 0.05, "gamma": 0.99},
        {"estimator": "reinforce_plus_plus", "kl_coef": 0.1, "gamma": 1.0, "kl_estimator": "k1"},
        {"estimator": "reinforce_plus_plus_baseline", "kl_coef": 0.05, "kl_estimator": "k2"},
        {"estimator": "ppo", "kl_coef": 0.02, "gamma": 0.99, "lambda": 0.95},
        {"estimator": "ppo", "gamma": 1.0, "lambda": 1.0, "normalize_advantages": True},
        {"normalize_advantages": True, "opd_coef": 0.3},
    ]
    out = {"samples": samples, "advantages": [], "weights": {}, "losses": []}
    for case in adv_cases:
        cfg = dict(ADV_BASE, **case)
        adv, returns = advantages(samples, cfg)
        out["advantages"].append({"config": cfg, "advantages": [a.tolist() for a in adv],
                                  "returns": None if returns is None else [r.tolist() for r in returns]})
    for mode in ("per_rollout_token_mean", "global_token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        out["weights"][mode] = [w.tolist() for w in weights(samples, mode)]
    grpo_adv, _ = advantages(samples, ADV_BASE)
    loss_cases = [
        ({}, "per_rollout_token_mean"),
        ({"eps_high": 0.28, "dual_clip": 3.0}, "global_token_mean"),
        ({"policy": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}, "seq_mean_token_mean"),
        ({"policy": "cispo", "eps_low": 0.2, "eps_high": 0.28}, "per_rollout_token_mean"),
        ({"policy": "sft"}, "global_token_mean"),
        ({"importance": {"level": "token", "mode": "truncate", "low": 0.0, "high": 2.0}}, "per_rollout_token_mean"),
        ({"importance": {"level": "sequence", "mode": "mask", "low": 0.5, "high": 2.0}}, "seq_mean_token_sum"),
        ({"importance": {"level": "geometric", "mode": "truncate", "low": 0.8, "high": 1.2}}, "per_rollout_token_mean"),
        ({"kl_loss_coef": 0.01, "kl_estimator": "k3"}, "per_rollout_token_mean"),
        ({"kl_loss_coef": 0.05, "kl_estimator": "k2", "kl_unbiased": True}, "global_token_mean"),
        ({"entropy_coef": 0.001, "value_coef": 0.5, "value_clip": 0.1}, "per_rollout_token_mean"),
        ({"observation_coef": 0.05}, "per_rollout_token_mean"),
    ]
    for case, mode in loss_cases:
        cfg = dict(LOSS_BASE, **case)
        result = loss_case(samples, grpo_adv, cfg, mode)
        out["losses"].append({"config": cfg, "aggregation": mode, **result})
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"rl math: {len(adv_cases)} advantage cases, 4 aggregation modes, {len(loss_cases)} loss cases -> {path}")


if __name__ == "__main__":
    write(sys.argv[1])
