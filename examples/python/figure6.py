"""The paper's Figure 6 for one sentence: the attention over the source and the context gate's value at every
output word. Draws a heatmap with a gate bar when matplotlib is installed (``--png FILE``), and always prints
the same as a text table.

    python examples/python/figure6.py MODEL_DIR "日本比加拿大小。" [--png figure6.png] [--beam 10]
"""

import argparse
import sys

import numpy as np

import cgnmt


def table(src, out, att, gates):
    """The attention rows (one per output word) over the source words, with each word's gate value."""
    width = max(6, *(len(s) for s in src))
    lines = [" " * 12 + " ".join(f"{s:>{width}}" for s in src) + "   gate"]
    for i, word in enumerate(out):
        row = " ".join(f"{x:>{width}.2f}" for x in att[i])
        gate = f"{gates[i]:.3f}" if i < len(gates) else "  -"
        lines.append(f"{word[:11]:>11} {row}   {gate}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("sentence")
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--png", help="write the figure here (needs matplotlib)")
    a = p.parse_args()
    tr = cgnmt.Translator(a.model)
    t = tr.translate([a.sentence], beam=a.beam, return_attention=True, return_gates=True)[0]
    src = t.source_tokens + ["</s>"]
    out = t.tokens + ["</s>"][: t.attention.shape[0] - len(t.tokens)]
    print(f"{a.sentence}  →  {t.text}   (log-probability {t.score:.3f})")
    print(table(src, out, t.attention, t.gates))
    if len(t.gates):
        print(f"mean gate {np.mean(t.gates):.3f} over {len(t.gates)} words")
    else:
        print("this model has no context gate")
    if a.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no figure (the table above has the same values)", file=sys.stderr)
            return 0
        fig, (ax, gx) = plt.subplots(
            1, 2, figsize=(1 + 0.6 * len(src), 1 + 0.45 * len(out)), gridspec_kw={"width_ratios": [len(src), 1]}
        )
        ax.imshow(t.attention, cmap="Greys", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(src)), src, rotation=60)
        ax.set_yticks(range(len(out)), out)
        gates = np.pad(t.gates, (0, len(out) - len(t.gates)))
        gx.barh(range(len(out)), gates, color="tab:blue")
        gx.set_ylim(len(out) - 0.5, -0.5)
        gx.set_xlim(0, 1)
        gx.set_yticks([])
        gx.set_title("gate")
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
        print(f"figure: {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
