//! The `k` best entries of a row of scores, as beam search takes them from each hypothesis's row of
//! log-probabilities or logits: one pass that skips, by a vectorised maximum, every block of the row that
//! cannot hold a candidate once `k` are found.

/// The `k` best `(score, column)` of a row, best first (ties: lower column first); `skip` is a column that
/// may not be chosen (EOS before the minimum length).
pub fn top_k(lp: &[f32], k: usize, skip: Option<u32>) -> Vec<(f32, u32)> {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    // Once `top` is full, a block whose largest value does not beat the k-th best holds no candidate: its
    // maximum (a vectorised pass) is all that is read of it.
    for (c, block) in lp.chunks(TOP_K_BLOCK).enumerate() {
        if top.len() == k && block_max(block) <= top[k - 1].0 {
            continue;
        }
        for (j, &x) in block.iter().enumerate() {
            let w = (c * TOP_K_BLOCK + j) as u32;
            if top.len() == k && x <= top[k - 1].0 {
                continue;
            }
            if Some(w) == skip {
                continue;
            }
            let pos = top.partition_point(|y| y.0 >= x);
            top.insert(pos, (x, w));
            top.truncate(k);
        }
    }
    top
}

/// Words per block of [`top_k`]'s scan.
const TOP_K_BLOCK: usize = 64;

/// The largest value of a block (`-∞` for an empty one; NaN is never the largest).
fn block_max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 (checked at run time).
        return unsafe { block_max_avx2(x) };
    }
    block_max_plain(x)
}

#[inline(always)]
fn block_max_plain(x: &[f32]) -> f32 {
    // Eight running maxima, so that the loop vectorises.
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (mi, &v) in m.iter_mut().zip(c) {
            *mi = if v > *mi { v } else { *mi };
        }
    }
    let mut best = f32::NEG_INFINITY;
    for &v in m.iter().chain(chunks.remainder()) {
        best = if v > best { v } else { best };
    }
    best
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_max_avx2(x: &[f32]) -> f32 {
    block_max_plain(x)
}

#[cfg(test)]
mod tests {
    use super::top_k;

    /// The `k` best by a full sort (ties: lower word id first), skipping `skip`.
    fn sorted_top(x: &[f32], k: usize, skip: Option<u32>) -> Vec<(f32, u32)> {
        let mut all: Vec<(f32, u32)> = x
            .iter()
            .enumerate()
            .map(|(w, &v)| (v, w as u32))
            .filter(|&(_, w)| Some(w) != skip)
            .collect();
        all.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        all.truncate(k);
        all
    }

    #[test]
    fn top_k_equals_a_full_sort() {
        // Rows longer and shorter than a block, with repeated values (ties across blocks), the best word
        // skipped, and k from 0 to more than the row holds.
        let mut seed = 7u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [1usize, 5, 63, 64, 65, 200, 1000] {
            for k in [0usize, 1, 3, 10, 70] {
                let x: Vec<f32> = (0..len)
                    .map(|_| (next() % 50) as f32 * 0.25 - 6.0)
                    .collect();
                let best = sorted_top(&x, 1, None).first().map(|b| b.1);
                for skip in [None, best, Some(0)] {
                    assert_eq!(
                        top_k(&x, k, skip),
                        sorted_top(&x, k, skip),
                        "len {len}, k {k}, skip {skip:?}"
                    );
                }
            }
        }
        // The best values late in the row (every block before them is passed over once `top` is full).
        let mut x = vec![-1.0f32; 300];
        x[299] = 5.0;
        x[250] = 4.0;
        assert_eq!(top_k(&x, 2, None), vec![(5.0, 299), (4.0, 250)]);
    }
}
