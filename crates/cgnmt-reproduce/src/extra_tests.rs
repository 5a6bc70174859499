//! The report's tables on the extra test sets (the harder half, another domain): every row's scores there,
//! with the paired bootstrap against its baseline as the main table's.

use anyhow::Result;
use cgnmt_eval::significance::{self, Metric};

use super::analyses::{bleu_ratio, mean, paired_by_seed, sd, BOOTSTRAP_SAMPLES};
use super::{RunResult, Setup};
use crate::results::{ExtraRow, ExtraTable};

/// Every row's scores on each extra test set, with the paired bootstrap against its baseline (as the main
/// table's).
pub(crate) fn extra_tables(
    s: &Setup,
    runs: &[RunResult],
    metric: &Metric,
) -> Result<Vec<ExtraTable>> {
    let mut tables = vec![];
    for (k, x) in s.extra_tests.iter().enumerate() {
        let refs = x
            .refs
            .iter()
            .map(|p| Ok(cgnmt_data::corpus::read_lines(p)?))
            .collect::<Result<Vec<_>>>()?;
        let of = |name: &str| -> Vec<&RunResult> {
            let mut v: Vec<&RunResult> = runs
                .iter()
                .filter(|r| r.system == name && r.extra.get(k).is_some_and(|e| e.name == x.name))
                .collect();
            v.sort_by_key(|r| r.seed);
            v
        };
        let stats = |r: &RunResult| -> Result<Vec<_>> {
            let hyps = cgnmt_data::corpus::read_lines(
                &s.out.join(&r.dir).join(format!("test-{}.hyp", x.name)),
            )?;
            Ok(metric.segment_stats(&hyps, &refs)?)
        };
        let mut rows = vec![];
        for sys in &s.plan.systems {
            let rs = of(&sys.name);
            let bleu: Vec<f64> = rs.iter().map(|r| r.extra[k].bleu).collect();
            let m = mean(&bleu);
            let base = sys.baseline.as_deref().map(of).unwrap_or_default();
            let base_mean = mean(&base.iter().map(|r| r.extra[k].bleu).collect::<Vec<_>>());
            let mut bootstrap_p = None;
            let paired = paired_by_seed(&rs, &base);
            if !paired.is_empty() {
                let (mut sys_stats, mut base_stats) = (vec![], vec![]);
                for (r, b) in &paired {
                    sys_stats.extend(stats(r)?);
                    base_stats.extend(stats(b)?);
                }
                let bs = significance::paired_bootstrap(
                    metric,
                    &base_stats,
                    &sys_stats,
                    BOOTSTRAP_SAMPLES,
                    significance::DEFAULT_SEED,
                )?;
                bootstrap_p = Some(if bs.sys_score == bs.base_score {
                    1.0
                } else {
                    bs.p_value
                });
            }
            rows.push(ExtraRow {
                system: sys.name.clone(),
                baseline: sys.baseline.clone(),
                seeds: rs.iter().map(|r| r.seed).collect(),
                mean: m,
                sd: sd(&bleu),
                bleu,
                sacrebleu_mean: mean(&rs.iter().map(|r| r.extra[k].sacrebleu).collect::<Vec<_>>()),
                chrf_mean: mean(&rs.iter().map(|r| r.extra[k].chrf).collect::<Vec<_>>()),
                length_ratio: mean(
                    &rs.iter()
                        .map(|r| r.extra[k].hyp_words as f64 / r.extra[k].ref_words.max(1.0))
                        .collect::<Vec<_>>(),
                ),
                bleu_length_ratio: mean(
                    &rs.iter()
                        .map(|r| {
                            let hyps = cgnmt_data::corpus::read_lines(
                                &s.out.join(&r.dir).join(format!("test-{}.hyp", x.name)),
                            )?;
                            bleu_ratio(&hyps, &refs)
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
                delta: match (m, base_mean) {
                    (Some(a), Some(b)) => Some(a - b),
                    _ => None,
                },
                bootstrap_p,
            });
        }
        tables.push(ExtraTable {
            name: x.name.clone(),
            description: x.description.clone(),
            sentences: x.sentences,
            min_ref_words: x.min_ref_words,
            rows,
        });
    }
    Ok(tables)
}
