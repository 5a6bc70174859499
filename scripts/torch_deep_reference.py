# The deep model of `cgnmt bench --size small-deep` (two bidirectional encoder layers with a residual connection,
# a depth-2 decoder transition) written op for op in PyTorch eager, on the batch of
# ../shared/bench/torch_reference.py: its one-layer model, extended the way cgnmt extends its own (model-spec §1
# and §3). The second encoder layer is a forward and a backward GRU over the 2H-wide annotations, added to them;
# the later transition is a GRU over the state alone (its input terms a bias), after the gated one.
# `small-deep-ln` (and `paper-deep-ln`, the Marian-like `s2s` at the paper's size) adds layer normalisation where cgnmt's `model.layer_norm` puts it (model-spec §5b): each block
# of every GRU's input and recurrent products ([2H | H]), the attention's keys and query, the transition's context
# product, and the readout's three terms, each with a learned gain and bias (torch.nn.functional.layer_norm).
# Usage: python scripts/torch_deep_reference.py train small-deep STEPS   (TORCH_THREADS, default 2)
#        python scripts/torch_deep_reference.py beam small-deep RUNS      (beam 10, 100 sentences, batched)
# The last line starts with RESULT, as the shared script's: median step time and target tokens/s; for `beam`,
# the median time and hypothesis steps (decoder rows) per second.
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("BENCH_DIR", os.path.join(HERE, "..", "..", "shared", "bench")))
import torch  # noqa: E402
import torch_reference as ref  # noqa: E402

CFGS = {
    "small-deep": ref.CFGS["small"],
    "paper-deep": ref.CFGS["paper"],
    "small-deep-ln": ref.CFGS["small"],
    "paper-deep-ln": ref.CFGS["paper"],
}
F = torch.nn.functional


def deep_shapes(c):
    e, h = c["e"], c["h"]
    extra = []
    for d in ["enc2f", "enc2b"]:
        extra += [(d + "_wx", [2 * h, 3 * h]), (d + "_wh", [h, 3 * h]), (d + "_bx", [3 * h]), (d + "_bh", [3 * h])]
    extra += [("dt_wh", [h, 3 * h]), ("dt_b", [3 * h]), ("dt_bh", [3 * h])]
    return ref.param_shapes(c) + extra


def ln_shapes(c):
    """Each layer normalisation's name and width (its gain and bias)."""
    e, h = c["e"], c["h"]
    out = []
    for d in ["encf", "encb", "enc2f", "enc2b"]:
        out += [(d + "_lnx", 3 * h), (d + "_lnh", 3 * h)]
    out += [("att_lnk", h), ("att_lnq", h), ("dec_lny", 3 * h), ("dec_lnc", 3 * h), ("dec_lnh", 3 * h),
            ("dt_lnh", 3 * h), ("ro_lns", e), ("ro_lnc", e), ("ro_lny", e)]
    return out


class DeepModel(ref.Model):
    def __init__(self, c, layer_norm=False):
        self.c = c
        self.p = {}
        g = torch.Generator().manual_seed(0)
        for n, sh in deep_shapes(c):
            t = torch.zeros(sh) if len(sh) == 1 else torch.rand(sh, generator=g) * 0.2 - 0.1
            self.p[n] = t.requires_grad_(True)
        self.layer_norm = layer_norm
        if layer_norm:
            for n, w in ln_shapes(c):
                self.p[n + "_g"] = torch.ones(w).requires_grad_(True)
                self.p[n + "_b"] = torch.zeros(w).requires_grad_(True)

    def ln(self, x, name):
        """`x` normalised in blocks [2H | H] (widths 3H) or as one block, scaled and shifted (no-op without
        layer normalisation)."""
        if not self.layer_norm:
            return x
        g, b = self.p[name + "_g"], self.p[name + "_b"]
        w = x.shape[-1]
        h = self.c["h"]
        if w != 3 * h:
            return F.layer_norm(x, (w,), g, b, 1e-5)
        return torch.cat([F.layer_norm(x[..., :2 * h], (2 * h,), g[:2 * h], b[:2 * h], 1e-5),
                          F.layer_norm(x[..., 2 * h:], (h,), g[2 * h:], b[2 * h:], 1e-5)], -1)

    def gru_ln(self, gx, gh, h, name):
        """The GRU with its recurrent product `gh` normalised in blocks (under `name`)."""
        return self.gru(gx, self.ln(gh, name), h)

    def layer(self, x2, mask, names, B, S):
        """One bidirectional layer over the rows x2 [B·S, in]: its states [B, S, 2H] and the backward ones."""
        p, c = self.p, self.c
        outs = []
        for d, reverse in names:
            gx = self.ln(x2 @ p[d + "_wx"] + p[d + "_bx"], d + "_lnx")
            gx = gx.reshape(B, S, -1).transpose(0, 1).contiguous()
            mt = mask.t().contiguous().unsqueeze(2)
            h = torch.zeros(B, c["h"])
            hs = [None] * S
            for t in (reversed(range(S)) if reverse else range(S)):
                gh = h @ p[d + "_wh"] + p[d + "_bh"]
                hn = self.gru_ln(gx[t], gh, h, d + "_lnh")
                h = h + mt[t] * (hn - h)
                hs[t] = h
            outs.append(torch.stack(hs, 1))
        return torch.cat(outs, 2)

    def encode(self, src, mask):
        p = self.p
        B, S = src.shape
        x2 = p["src_emb"][src.reshape(-1)]
        a1 = self.layer(x2, mask, [("encf", False), ("encb", True)], B, S)
        a2 = self.layer(a1.reshape(B * S, -1), mask, [("enc2f", False), ("enc2b", True)], B, S) + a1
        keys = (self.ln(a2.reshape(B * S, -1) @ p["att_wk"], "att_lnk") + p["att_b"]).reshape(B, S, -1)
        h = self.c["h"]
        s0 = torch.tanh(a2[:, 0, h:] @ p["init_w"] + p["init_b"])
        return a2, keys, s0

    def dec_step(self, s_prev, yx, yz, enc, keys, mask_bias):
        p = self.p
        if self.layer_norm:
            # The shared script's step with the query, the context product and the recurrent product normalised.
            B, S, A = keys.shape
            q = self.ln(s_prev @ p["att_wq"], "att_lnq")
            e = torch.tanh(keys + q.unsqueeze(1))
            sc = (e.reshape(B * S, A) @ p["att_v"]).reshape(B, S) + mask_bias
            alpha = torch.softmax(sc, -1)
            ctx = torch.bmm(alpha.unsqueeze(1), enc).squeeze(1)
            z = torch.sigmoid(yz + s_prev @ p["gate_ws"] + ctx @ p["gate_wc"])
            cx = self.ln(ctx @ p["dec_wc"], "dec_lnc")
            gx = z * cx + (1 - z) * yx
            gh = s_prev @ p["dec_wh"] + p["dec_bh"]
            s = self.gru_ln(gx, gh, s_prev, "dec_lnh")
        else:
            s, ctx = super().dec_step(s_prev, yx, yz, enc, keys, mask_bias)
        gh = s @ p["dt_wh"] + p["dt_bh"]
        return self.gru_ln(p["dt_b"].expand(s.shape[0], -1), gh, s, "dt_lnh"), ctx

    def loss(self, batch):
        if not self.layer_norm:
            return super().loss(batch)
        # The shared script's loss with the word projections and the readout's terms normalised.
        p = self.p
        src, sm, ti, to, tm = batch
        B, T = ti.shape
        enc, keys, s = self.encode(src, sm)
        mask_bias = (1 - sm) * -1e9
        y2 = p["tgt_emb"][ti.reshape(-1)]
        yx = self.ln(y2 @ p["dec_wy"] + p["dec_bx"], "dec_lny").reshape(B, T, -1).transpose(0, 1).contiguous()
        yz = (y2 @ p["gate_wy"] + p["gate_b"]).reshape(B, T, -1).transpose(0, 1).contiguous()
        ss, cs = [], []
        for i in range(T):
            s, ctx = self.dec_step(s, yx[i], yz[i], enc, keys, mask_bias)
            ss.append(s)
            cs.append(ctx)
        st = torch.stack(ss, 1).reshape(B * T, -1)
        ct = torch.stack(cs, 1).reshape(B * T, -1)
        ro = torch.tanh(self.ln(st @ p["ro_ws"], "ro_lns") + self.ln(ct @ p["ro_wc"], "ro_lnc")
                        + self.ln(y2 @ p["ro_wy"], "ro_lny") + p["ro_b"])
        logp = torch.log_softmax(ro @ p["out_w"] + p["out_b"], -1)
        picked = logp.gather(1, to.unsqueeze(1)).squeeze(1)
        return -(picked * tm).sum() / tm.sum()

    @torch.no_grad()
    def beam(self, src, sm, k, max_len):
        """Beam search over a batch, all sentences' k hypotheses as one batch of rows, every hypothesis run for
        max_len steps (no early stop): returns the best token sequences and the hypothesis steps computed."""
        p = self.p
        B = src.shape[0]
        enc, keys, s = self.encode(src, sm)
        V = p["out_w"].shape[1]
        rep = lambda x: x.repeat_interleave(k, 0)
        enc, keys, s = rep(enc), rep(keys), rep(s)
        mask_bias = rep((1 - sm) * -1e9)
        prev = torch.ones(B * k, dtype=torch.long)
        score = torch.full((B, k), -1e9)
        score[:, 0] = 0.0
        hist = []
        rows = 0
        for _ in range(max_len):
            y = p["tgt_emb"][prev]
            yx = y @ p["dec_wy"] + p["dec_bx"]
            yz = y @ p["gate_wy"] + p["gate_b"]
            s, ctx = self.dec_step(s, yx, yz, enc, keys, mask_bias)
            ro = torch.tanh(s @ p["ro_ws"] + ctx @ p["ro_wc"] + y @ p["ro_wy"] + p["ro_b"])
            logp = torch.log_softmax(ro @ p["out_w"] + p["out_b"], -1)
            rows += B * k
            total = (score.reshape(B * k, 1) + logp).reshape(B, k * V)
            score, idx = total.topk(k, -1)
            parent = (idx // V) + torch.arange(B).unsqueeze(1) * k
            prev = (idx % V).reshape(-1)
            parent = parent.reshape(-1)
            s = s[parent]
            hist = [h[parent] for h in hist] + [prev]
        return torch.stack(hist, 1).reshape(B, k, -1)[:, 0], rows


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "train"
    cfgname = sys.argv[2] if len(sys.argv) > 2 else "small-deep"
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    c = CFGS[cfgname]
    m = DeepModel(c, layer_norm=cfgname.endswith("-ln"))
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} mode={mode} cfg={cfgname} "
          f"params={sum(t.numel() for t in m.p.values())}")
    if mode == "beam" and m.layer_norm:
        sys.exit("beam mode: small-deep or paper-deep (the layer-normalised model trains only)")
    if mode == "beam":
        batch = ref.make_batch(c, 100, 2)
        times = []
        for r in range(steps):
            t0 = time.perf_counter()
            out, rows = m.beam(batch[0], batch[1], 10, c["t"])
            dt = time.perf_counter() - t0
            print(f"beam run {r}: {dt:.3f}s first={out[0, :5].tolist()}", flush=True)
            if r > 0:
                times.append(dt)
        md = statistics.median(times)
        print(f"RESULT torch beam10 cfg={cfgname} 100 sents x {c['t']} steps median={md:.3f}s sent/s={100 / md:.1f} "
              f"hyp_steps/s={rows / md:.0f}")
        return
    if mode != "train":
        sys.exit("modes: train, beam")
    opt = torch.optim.Adam(list(m.p.values()), lr=1e-3)
    batch = ref.make_batch(c, c["b"], 1)
    ntok = float(batch[4].sum())
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        loss = m.loss(batch)
        lv = loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {step} loss={lv:.5f} total={dt:.3f}s", flush=True)
        if step > 0:
            times.append(dt)
    md = statistics.median(times)
    print(f"RESULT torch train cfg={cfgname} median_step={md:.3f}s tgt_tokens/step={ntok:.0f} tok/s={ntok / md:.0f}")


if __name__ == "__main__":
    main()
