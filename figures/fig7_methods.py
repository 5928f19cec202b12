"""Figure 7 -- tokens per target call of the methods the field is built on (SPEC §16).

Reads the committed records of ``python benchmarks/methods_heads.py`` (``figures/data/methods_heads.json``:
blockwise parallel decoding and Medusa, exact) and ``python benchmarks/methods_retrieval.py``
(``figures/data/methods_retrieval.json``: Lookahead decoding and REST, exact on a bigram and greedy on
the toy language).  Three panels, each against Algorithm 1 with a draft model on the same toy pair:

- left: blockwise parallel decoding (greedy) against the number of heads k, and Medusa's point-mass
  tree (temperature 1) against its number of nodes -- exact calls per token, shown as tokens per call;
- middle: Lookahead (as published; with the bonus token) against its window W, REST against its trie
  size (point-mass verification, lossless; the published rule, not lossless, dashed) -- exact;
- right: greedy decoding of the toy language (100 prompts, 16 tokens): Lookahead against W and REST
  against its trie size, on the trigram model and on the tiny transformer.

Keys used: ``methods_heads.json``: ``greedy`` [{``k``, ``blockwise_tokens_per_call``,
``algorithm_1_calls_per_token``}], ``sampling`` [{``nodes``, ``depth``, ``medusa_tokens_per_call``,
``algorithm_1_calls_per_token``}]; ``methods_retrieval.json``: ``exact`` {``lookahead`` [{``W``, ``N``, ``G``,
``bonus``, ``tokens_per_call``}], ``rest`` [{``num_draft``, ``verify``, ``tokens_per_call``}], ``chain``
[{``k``, ``tokens_per_call``}]}, ``greedy`` {``trigram``, ``transformer``: {``lookahead`` [{``W``,
``tokens_per_call``}], ``rest`` [{``num_draft``, ``tokens_per_call``}]}}.  A missing record draws a
panel that says how to make it.
"""

from __future__ import annotations

from figures._common import DATA_DIR, DEFAULT_OUT_DIR, display_path, new_figure, num, placeholder, read_json, \
    render, run_as_script

NAME = "fig7_methods"
HEADS = DATA_DIR / "methods_heads.json"
RETRIEVAL = DATA_DIR / "methods_retrieval.json"
HINTS = {"heads": "run python benchmarks/methods_heads.py", "retrieval": "run python benchmarks/methods_retrieval.py"}

CAPTION = (
    "Computed exactly from each method's law (left, middle; SPEC §16), or counted over 100 greedy decodes "
    "of 16 tokens (right); sources {heads} and {retrieval}. Tokens per target call = 1 / (calls per token), "
    "the first call on the prompt counted. Left: blockwise parallel decoding (greedy, k heads of exact "
    "marginals) and Medusa's point-mass tree (lossless, temperature 1) on a V = 5 bigram, 8 tokens; "
    "horizontal marks: Algorithm 1 with a draft model at K = k (blockwise) or K = tree depth (Medusa). "
    "Middle: Lookahead (N = 3, G = 4) as published and with the bonus token, and REST (trie of the "
    "num_draft most frequent continuations of length 4) with point-mass verification, on a V = 3 bigram, 5 "
    "tokens; "
    "REST's published rule (dashed) accepts more but is not lossless (TV 0.31 to 0.37). Horizontal: "
    "Algorithm 1 with a unigram draft, K = 1 to 4. Right: greedy decoding, Lookahead (N = 3, G = W) and "
    "REST (length 10), on the trigram model (solid) and the tiny transformer (dashed). Far right: Medusa's "
    "typical acceptance, exact TV to the target against ε for each δ of the grid, as the paper writes it "
    "(greedy token after the accepted prefix: the output is deterministic, TV near 1) and with that token "
    "sampled (TV 0 only where nothing passes)."
)


def _points(rows, x, y, **where):
    chosen = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    chosen.sort(key=lambda r: r[x])
    return [r[x] for r in chosen], [num(r[y]) for r in chosen]


def _heads(raw):
    if raw is None:
        return None
    greedy = raw["greedy"]
    medusa = sorted(raw["sampling"], key=lambda r: r["nodes"])
    typical = [[r["epsilon"], num(r["delta"]), num(r["tv"]), num(r["tv_sampled_next"])] for r in raw["typical"]]
    return {"typical": typical,
            "blockwise": _points(greedy, "k", "blockwise_tokens_per_call"),
            "blockwise_algorithm_1": [[r["k"], num(1 / r["algorithm_1_calls_per_token"])] for r in greedy],
            "medusa": [[r["nodes"] for r in medusa], [num(r["medusa_tokens_per_call"]) for r in medusa]],
            "medusa_algorithm_1": sorted({(r["depth"], num(1 / r["algorithm_1_calls_per_token"])) for r in medusa})}


def _retrieval(raw):
    if raw is None:
        return None
    e, g = raw["exact"], raw["greedy"]
    length = max(r["length"] for r in e["rest"])
    return {
        "lookahead": _points(e["lookahead"], "W", "tokens_per_call", N=3, G=4, bonus=False),
        "lookahead_bonus": _points(e["lookahead"], "W", "tokens_per_call", N=3, G=4, bonus=True),
        "rest_length": length,
        "rest_pointmass": _points(e["rest"], "num_draft", "tokens_per_call", verify="pointmass", length=length),
        "rest_published": _points(e["rest"], "num_draft", "tokens_per_call", verify="rest", length=length),
        "chain": [[r["k"], num(r["tokens_per_call"])] for r in e["chain"]],
        "greedy": {model: {"lookahead": _points(g[model]["lookahead"], "W", "tokens_per_call", N=3),
                           "rest": _points(g[model]["rest"], "num_draft", "tokens_per_call")}
                   for model in ("trigram", "transformer")},
    }


def compute(heads_path=HEADS, retrieval_path=RETRIEVAL) -> dict:
    sources = {"heads": display_path(heads_path), "retrieval": display_path(retrieval_path)}
    return {"figure": NAME, "caption": CAPTION.format(**sources), "sources": sources, "hints": HINTS,
            "heads": _heads(read_json(heads_path)), "retrieval": _retrieval(read_json(retrieval_path))}


def _draw_heads(ax, h):
    ax.plot(*h["blockwise"], "o-", color="tab:blue", label="blockwise (greedy), x = heads k")
    for i, (k, t) in enumerate(h["blockwise_algorithm_1"]):
        ax.plot([k * 0.8, k * 1.25], [t, t], color="tab:blue", lw=1.5, alpha=0.6,
                label=None if i else "Algorithm 1 with a draft model, K = k")
    ax.plot(*h["medusa"], "s", color="tab:green", label="Medusa point-mass tree (each tree), x = nodes")
    for depth, t in h["medusa_algorithm_1"]:
        ax.axhline(t, color="tab:green", ls=":", lw=1)
        ax.text(1, t, f" Algorithm 1, K = {depth}", fontsize=7, va="bottom", color="tab:green")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("heads k (blockwise) / tree nodes (Medusa)")
    ax.set_title("Heads on the target (exact)")


def _draw_typical(ax, h):
    deltas = sorted({d for _, d, _, _ in h["typical"]})
    for i, delta in enumerate(deltas):
        rows = sorted((e, tv, tvs) for e, d, tv, tvs in h["typical"] if d == delta)
        if len(rows) < 2:
            continue
        color = f"C{i}"
        ax.plot([e for e, _, _ in rows], [tv for _, tv, _ in rows], "o-", color=color, label=f"δ = {delta:g}, as published")
        ax.plot([e for e, _, _ in rows], [tvs for _, _, tvs in rows], "s--", color=color, alpha=0.7,
                label=f"δ = {delta:g}, token after the prefix sampled")
    ax.set_xscale("log")
    ax.set_xlabel("ε")
    ax.set_title("Medusa typical acceptance: exact TV to the target")


def _draw_retrieval(ax, r):
    ax.plot(*r["lookahead"], "o-", color="tab:purple", label="Lookahead as published, x = W")
    ax.plot(*r["lookahead_bonus"], "o--", color="tab:purple", alpha=0.6, label="Lookahead with the bonus token")
    ax.plot(*r["rest_pointmass"], "s-", color="tab:brown", label="REST, point mass (lossless), x = trie size")
    ax.plot(*r["rest_published"], "s--", color="tab:red", alpha=0.7, label="REST as published (not lossless)")
    for k, t in r["chain"]:
        ax.axhline(t, color="gray", ls=":", lw=1)
        ax.text(1, t, f" Algorithm 1, K = {k}", fontsize=7, va="bottom", color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window W (Lookahead) / trie size (REST)")
    ax.set_title("Retrieval and Jacobi drafts (exact, T = 1)")


def _draw_greedy(ax, g):
    for model, style in (("trigram", "-"), ("transformer", "--")):
        ax.plot(*g[model]["lookahead"], "o" + style, color="tab:purple", label=f"Lookahead, {model}, x = W")
        ax.plot(*g[model]["rest"], "s" + style, color="tab:brown", label=f"REST, {model}, x = trie size")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window W (Lookahead) / trie size (REST)")
    ax.set_title("Greedy decoding of the toy language")


def draw(data: dict):
    fig, axes = new_figure(1, 4, width=20, height=4.6)
    ylabel = "tokens per target call"
    panels = ((axes[0, 0], "heads", _draw_heads, data["heads"]),
              (axes[0, 1], "retrieval", _draw_retrieval, data["retrieval"]),
              (axes[0, 2], "retrieval", _draw_greedy, None if data["retrieval"] is None else data["retrieval"]["greedy"]),
              (axes[0, 3], "heads", _draw_typical, data["heads"]))
    for ax, source, fn, values in panels:
        if values is None:
            placeholder(ax, f"No data: {data['sources'][source]} is missing. To produce it, {data['hints'][source]}.",
                        xlabel="size", ylabel=ylabel)
            continue
        fn(ax, values)
        ax.set_ylabel("total variation" if fn is _draw_typical else ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left" if fn is _draw_typical else "upper left", fontsize=7)
    return fig


def main(out_dir=DEFAULT_OUT_DIR, *, heads_path=HEADS, retrieval_path=RETRIEVAL) -> list:
    """Draw the figure into ``out_dir`` from the two records; returns the paths written (PNG, JSON)."""
    return render(NAME, compute, draw, out_dir, heads_path, retrieval_path)


if __name__ == "__main__":
    run_as_script(main)
