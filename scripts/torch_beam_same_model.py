# Beam search over the same model in PyTorch eager: loads a cgnmt model directory (config.toml, vocab.src,
# model.safetensors) and decodes the sources of a `cgnmt translate --dump` file with the same search as
# `cgnmt translate` (model-spec §7): beam 10, each sentence's beam shrinking by one for every finished
# hypothesis, EOS forbidden before (n + 1) / 2 words, at most 3(n + 1) words, a sentence settled once its best
# finished hypothesis scores at least its best live one, hypotheses ranked by total log-probability. The
# sentences of a batch decode together, their live hypotheses as one batch of rows (gathered after every step).
# The model is written from model-spec §1–§4 in torch ops: the bidirectional encoder (stacked layers with
# residual connections), the attention, the context gate (any variant, reference form), the GRU transition with
# a deep transition, the maxout readout and the (tied) output layer, with layer normalisation where
# `model.layer_norm` puts it (§5b). Other configurations are refused.
#
# It prints how many translations equal cgnmt's (token for token) and the largest score difference, then times
# the search (median of RUNS runs after a warm-up) and prints a RESULT line: sentences/s and hypothesis steps/s.
# Usage: python scripts/torch_beam_same_model.py MODEL_DIR DUMP.jsonl [RUNS] [BATCH]   (TORCH_THREADS, default 2)
import json
import os
import statistics
import struct
import sys
import time
import tomllib

import torch

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))


def load_safetensors(path):
    """The tensors of a safetensors file (f32 only), by name."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {meta['dtype']}, not F32")
        a, b = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(meta["shape"])
    return out


def read_vocab(path):
    """One word per line, the id its line's index."""
    words = open(path, encoding="utf-8").read().split("\n")
    return words[:-1] if words and words[-1] == "" else words


class Model:
    def __init__(self, model_dir):
        cfg = tomllib.load(open(os.path.join(model_dir, "config.toml"), "rb"))["model"]
        need = {"decoder": "gru", "gate_form": "reference", "coverage": "none"}
        for k, v in need.items():
            if cfg.get(k) != v:
                sys.exit(f"model.{k} = {cfg.get(k)!r}: this script writes {k} = {v!r} only")
        if cfg.get("gating_scalar") or cfg.get("static_interpolation"):
            sys.exit("the gating scalar and static interpolation are not written here")
        self.layer_norm = cfg.get("layer_norm", False)
        if cfg.get("encoder_type", "bidirectional") != "bidirectional":
            sys.exit("only bidirectional encoder layers are written here")
        self.gate = cfg["context_gate"]
        self.inputs = set(cfg.get("gate_inputs", ["word", "state", "context"]))
        self.layers = cfg.get("encoder_layers", 1)
        self.residual = cfg.get("residual", True)
        self.depth = cfg.get("decoder_transition_depth", 1)
        self.h = cfg["hidden_dim"]
        p = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.p = p
        # Tied output embeddings: W_2 = E_yᵀ.
        self.w2 = p["decoder.E"].t().contiguous() if cfg.get("tied_output_embeddings") else p["decoder.readout.W_2"]
        self.vocab = {w: i for i, w in enumerate(read_vocab(os.path.join(model_dir, "vocab.src")))}
        self.tgt_vocab = read_vocab(os.path.join(model_dir, "vocab.tgt"))
        h = self.h
        z2 = torch.zeros(2 * h)
        # Each encoder GRU's input bias [0 | 0 | b] and the decoder's word projection bias.
        self.bias = {k[:-2]: torch.cat([z2, v]) for k, v in p.items() if k.endswith(".b") and v.shape == (h,)}

    def ln(self, x, name, blocks):
        """Layer normalisation (model-spec §5b) of x's blocks under `name` (x itself without it)."""
        if not self.layer_norm:
            return x
        g, b = self.p[name + ".g"], self.p[name + ".b"]
        parts, at = [], 0
        for n in blocks:
            parts.append(torch.nn.functional.layer_norm(x[..., at:at + n], (n,), g[at:at + n], b[at:at + n], 1e-5))
            at += n
        return parts[0] if len(parts) == 1 else torch.cat(parts, -1)

    def gru_layer(self, x, mask, prefix, reverse):
        """One direction of an encoder layer over x [B, S, in]: its states [B, S, H]."""
        p, h = self.p, self.h
        B, S, _ = x.shape
        xp = self.ln(x @ p[prefix + ".W"] + self.bias[prefix], prefix + ".ln_W", [2 * h, h]).transpose(0, 1)
        m = mask.t().unsqueeze(2)
        st = torch.zeros(B, h)
        out = [None] * S
        for t in (reversed(range(S)) if reverse else range(S)):
            ru = torch.sigmoid(xp[t, :, :2 * h] + self.ln(st @ p[prefix + ".U_ru"], prefix + ".ln_U_ru", [2 * h]))
            r, u = ru[:, :h], ru[:, h:]
            c = torch.tanh(xp[t, :, 2 * h:] + self.ln((r * st) @ p[prefix + ".U"], prefix + ".ln_U", [h]))
            st = st + m[t] * u * (c - st)
            out[t] = st
        return torch.stack(out, 1)

    def encode(self, src, mask):
        p, h = self.p, self.h
        x = p["encoder.E"][src] + p["encoder.b_e"]
        ann = torch.cat([self.gru_layer(x, mask, "encoder.fwd", False), self.gru_layer(x, mask, "encoder.bwd", True)], 2)
        for l in range(2, self.layers + 1):
            a = f"encoder.layer{l}"
            out = torch.cat([self.gru_layer(ann, mask, a + ".fwd", False), self.gru_layer(ann, mask, a + ".bwd", True)], 2)
            ann = out + ann if self.residual else out
        t0 = torch.tanh(ann[:, 0, h:] @ p["decoder.init.W_init"] + p["decoder.init.b_init"])
        a = p["decoder.attention.A"]
        keys = self.ln(ann @ a, "decoder.attention.ln_A", [a.shape[1]])
        return ann, keys, t0

    def logp(self, t, e_prev, ann, keys, mask_bias):
        """Attention from t [R, H] over each row's sentence (ann, keys, mask_bias gathered per row), then the
        readout and the output layer: log-probabilities [R, V] and the context [R, 2H]."""
        p, h = self.p, self.h
        q = self.ln(t @ p["decoder.attention.B"], "decoder.attention.ln_B", [p["decoder.attention.B"].shape[1]])
        e = (torch.tanh(keys + q.unsqueeze(1)) @ p["decoder.attention.v"]).squeeze(2) + mask_bias
        alpha = torch.softmax(e, -1)
        ctx = torch.bmm(alpha.unsqueeze(1), ann).squeeze(1)
        r = (self.ln(ctx @ p["decoder.readout.W_o"], "decoder.readout.ln_W_o", [h])
             + self.ln(t @ p["decoder.readout.U_o"], "decoder.readout.ln_U_o", [h])
             + self.ln(e_prev @ p["decoder.readout.V_o"], "decoder.readout.ln_V_o", [h]))
        r = (r + p["decoder.readout.b_o"]).reshape(-1, h // 2, 2).amax(-1)
        logits = (r @ p["decoder.readout.W_1"]) @ self.w2 + p["decoder.readout.b"]
        return torch.log_softmax(logits, -1), ctx

    def transition(self, t, e, ctx):
        """The gated GRU transition (reference form) and the deep transition's later GRUs."""
        p, h = self.p, self.h
        zp = 0
        if self.gate != "none":
            if "word" in self.inputs:
                zp = zp + e @ p["decoder.gate.W_z"]
            if "state" in self.inputs:
                zp = zp + t @ p["decoder.gate.U_z"]
            if "context" in self.inputs:
                zp = zp + ctx @ p["decoder.gate.C_z"]
        z = torch.sigmoid(zp) if self.gate != "none" else None
        S = {"none": 1.0, "source": z, "target": 1.0, "both": z}[self.gate]
        T = {"none": 1.0, "source": 1.0, "target": z, "both": None if z is None else 1 - z}[self.gate]
        ts = T * t
        xw = self.ln(e @ p["decoder.cell.W"] + self.bias["decoder.cell"], "decoder.cell.ln_W", [2 * h, h])
        cs = self.ln(ctx @ p["decoder.cell.C"], "decoder.cell.ln_C", [2 * h, h])
        # (A scale of width H scales each block: [r | u] takes it twice.)
        two = lambda x: x if isinstance(x, float) else torch.cat([x, x], 1)
        ru = torch.sigmoid(two(T) * xw[:, :2 * h] + two(S) * cs[:, :2 * h]
                           + self.ln(ts @ p["decoder.cell.U_ru"], "decoder.cell.ln_U_ru", [2 * h]))
        r, u = ru[:, :h], ru[:, h:]
        c = torch.tanh(T * xw[:, 2 * h:] + S * cs[:, 2 * h:]
                       + self.ln((r * ts) @ p["decoder.cell.U"], "decoder.cell.ln_U", [h]))
        t = ts + u * (c - ts)
        for k in range(2, self.depth + 1):
            d = f"decoder.cell.deep{k}"
            b = p[d + ".b"]
            ru = torch.sigmoid(b[:2 * h] + self.ln(t @ p[d + ".U_ru"], d + ".ln_U_ru", [2 * h]))
            r, u = ru[:, :h], ru[:, h:]
            c = torch.tanh(b[2 * h:] + self.ln((r * t) @ p[d + ".U"], d + ".ln_U", [h]))
            t = t + u * (c - t)
        return t


@torch.no_grad()
def beam_search(m, srcs, beam):
    """cgnmt's beam search (see the header) over sentences `srcs` (ids without EOS): each one's best
    hypothesis (tokens, score) and the hypothesis steps computed."""
    nb = len(srcs)
    S = max(len(s) for s in srcs) + 1
    src = torch.zeros(nb, S, dtype=torch.long)
    mask = torch.zeros(nb, S)
    for i, s in enumerate(srcs):
        src[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s) + 1] = 1.0
    ann, keys, t = m.encode(src, mask)
    mask_bias = (mask - 1.0) * 1e9
    limits = [((len(s) + 1) // 2, 3 * (len(s) + 1)) for s in srcs]
    # Live hypotheses: their sentence, score and tokens; one row each.
    sent = list(range(nb))
    scores = [0.0] * nb
    toks = [[] for _ in range(nb)]
    finished = [[] for _ in range(nb)]
    e_prev = torch.zeros(nb, m.p["decoder.E"].shape[1])
    rows_s = torch.arange(nb)
    steps = 0
    step = 0
    while sent:
        lp, ctx = m.logp(t, e_prev, ann[rows_s], keys[rows_s], mask_bias[rows_s])
        steps += len(sent)
        # EOS (id 0) forbidden before the minimum length.
        ban = torch.tensor([step < limits[s][0] for s in sent])
        if bool(ban.any()):
            lp[ban, 0] = float("-inf")
        top_v, top_i = lp.topk(beam, 1)
        top_v, top_i = top_v.tolist(), top_i.tolist()
        # Each sentence's best k continuations (k = its remaining beam) over its rows' candidates.
        by_sent = {}
        for r, s in enumerate(sent):
            k = beam - len(finished[s])
            c = by_sent.setdefault(s, [])
            c.extend((scores[r] + v, r, w) for v, w in zip(top_v[r][:k], top_i[r][:k]))
        parents, words, n_sent, n_scores, n_toks = [], [], [], [], []
        for s, c in by_sent.items():
            c.sort(key=lambda x: (-x[0], x[1]))
            for sc, r, w in c[:beam - len(finished[s])]:
                if w == 0:
                    finished[s].append((sc, toks[r]))
                else:
                    parents.append(r)
                    words.append(w)
                    n_sent.append(s)
                    n_scores.append(sc)
                    n_toks.append(toks[r] + [w])
        # Retire: the maximum length, or a full beam; then drop settled sentences.
        keep = []
        for i, s in enumerate(n_sent):
            if len(n_toks[i]) >= limits[s][1] or len(finished[s]) >= beam:
                if len(finished[s]) < beam:
                    finished[s].append((n_scores[i], n_toks[i]))
            else:
                keep.append(i)
        best_live = {}
        for i in keep:
            best_live[n_sent[i]] = max(best_live.get(n_sent[i], float("-inf")), n_scores[i])
        keep = [i for i in keep
                if not (finished[n_sent[i]] and max(f[0] for f in finished[n_sent[i]]) >= best_live[n_sent[i]])]
        if not keep:
            break
        par = torch.tensor([parents[i] for i in keep])
        wt = torch.tensor([words[i] for i in keep])
        e = m.p["decoder.E"][wt]
        t = m.transition(t[par], e, ctx[par])
        e_prev = e
        sent = [n_sent[i] for i in keep]
        scores = [n_scores[i] for i in keep]
        toks = [n_toks[i] for i in keep]
        rows_s = torch.tensor(sent)
        step += 1
    best = []
    for f in finished:
        # Best total log-probability; the first finished among equals.
        top = max(range(len(f)), key=lambda j: (f[j][0], -j))
        best.append(f[top])
    return best, steps


def main():
    model_dir, dump = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    m = Model(model_dir)
    recs = [json.loads(line) for line in open(dump)]
    unk = m.vocab["<unk>"]
    srcs = [[m.vocab.get(w, unk) for w in r["src"][:-1]] for r in recs]
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} sentences={len(srcs)} batch={batch}")

    def decode():
        out, steps = [], 0
        for i in range(0, len(srcs), batch):
            b, n = beam_search(m, srcs[i:i + batch], 10)
            out.extend(b)
            steps += n
        return out, steps

    out, steps = decode()
    same = sum(1 for (sc, tk), r in zip(out, recs) if [m.tgt_vocab[w] for w in tk] == r["hyp"][:-1]
               or [m.tgt_vocab[w] for w in tk] == r["hyp"])
    worst = max(abs(sc - r["score"]) for (sc, tk), r in zip(out, recs)
                if [m.tgt_vocab[w] for w in tk] in (r["hyp"][:-1], r["hyp"]))
    print(f"same translations as cgnmt: {same} of {len(recs)}; largest score difference among them {worst:.2e}")
    times = []
    for r in range(runs):
        t0 = time.perf_counter()
        decode()
        times.append(time.perf_counter() - t0)
        print(f"run {r}: {times[-1]:.2f}s", flush=True)
    md = statistics.median(times)
    print(f"RESULT torch beam10 same model: {len(srcs)} sentences median={md:.2f}s sent/s={len(srcs) / md:.1f} "
          f"hyp_steps/s={steps / md:.0f} hyp_steps={steps} same={same}")


if __name__ == "__main__":
    main()
