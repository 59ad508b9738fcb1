"""Chains of live spans and cached bodies shared by the chain-forward tests of the linear
families (test_chain_forward.py: Gated DeltaNet; test_simple_gla_chain.py: lightning)."""

import torch
import torch.nn.functional as F

H, HV, K, V = 2, 4, 16, 8


def tokens(n, gen, dtype, h=H, hv=HV, kd=K, vd=V):
    return dict(q=F.normalize(torch.randn(n, h, kd, generator=gen, dtype=torch.float64), dim=-1).to(dtype),
                k=F.normalize(torch.randn(n, h, kd, generator=gen, dtype=torch.float64), dim=-1).to(dtype),
                v=torch.randn(n, hv, vd, generator=gen, dtype=torch.float64).to(dtype),
                g=F.logsigmoid(torch.randn(n, hv, generator=gen, dtype=torch.float64) + 2.0).to(dtype),
                beta=torch.sigmoid(torch.randn(n, hv, generator=gen, dtype=torch.float64)).to(dtype))


def chain_problem(pieces, live_order, seed=0, dtype=torch.float64, **dims):
    """Chains of pieces ``("live" | "body", num_tokens)``. Returns the whole chains' tokens and
    bounds, the live spans' tokens (in ``live_order``, a permutation of the live pieces), their
    bounds, the bodies' tokens and bounds, and ``source``."""
    gen = torch.Generator().manual_seed(seed)
    chains = [[(kind, n, tokens(n, gen, dtype, **dims)) for kind, n in chain] for chain in pieces]
    cat = lambda xs, key: torch.cat([x[key] for x in xs])  # noqa: E731
    whole = [x for chain in chains for _, _, x in chain]
    full = {key: cat(whole, key) for key in whole[0]}
    cu_full = torch.tensor([0] + [sum(n for _, n, _ in c) for c in chains]).cumsum(0)
    lives = [(n, x) for chain in chains for kind, n, x in chain if kind == "live"]
    bodies = [(n, x) for chain in chains for kind, n, x in chain if kind == "body"]
    live = {key: cat([lives[i][1] for i in live_order], key) for key in whole[0]}
    cu_live = torch.tensor([0] + [lives[i][0] for i in live_order]).cumsum(0)
    body = {key: cat([x for _, x in bodies], key) for key in whole[0]} if bodies else None
    cu_body = torch.tensor([0] + [n for n, _ in bodies]).cumsum(0)
    span_of = {piece: s for s, piece in enumerate(live_order)}
    source, live_i, body_i = [], 0, 0
    for chain in chains:
        for kind, _, _ in chain:
            if kind == "live":
                source.append(span_of[live_i])
                live_i += 1
            else:
                source.append(-body_i - 1)
                body_i += 1
    cu_chains = torch.tensor([0] + [len(c) for c in chains]).cumsum(0)
    return full, cu_full, live, cu_live, body, cu_body, torch.tensor(source), cu_chains


def live_rows(pieces, live_order) -> torch.Tensor:
    """The rows of the live spans in the whole chains' tokens (``chain_problem``'s ``full``), in
    ``live_order``: what a forward over the whole chains outputs for the live tokens."""
    starts, pos = [], 0
    for chain in pieces:
        for kind, n in chain:
            if kind == "live":
                starts.append((pos, n))
            pos += n
    return torch.cat([torch.arange(starts[i][0], starts[i][0] + starts[i][1]) for i in live_order])
