//! A reproduction plan (`configs/reproduce/*.toml`): the data, the settings every system shares, the systems
//! (the paper's rows, each with the `--set` overrides that make it and the row it is compared against) and the
//! analyses. Unknown keys are errors; names are checked against each other when the plan is loaded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use cgnmt::config::Config;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// `train.seed` values; every system is trained once per seed.
    pub seeds: Vec<u64>,
    pub data: PlanData,
    #[serde(default)]
    pub train: Overrides,
    #[serde(default)]
    pub decode: DecodeSpec,
    #[serde(default)]
    pub quick: QuickSpec,
    /// Table id → title, e.g. `"2" = "Translation quality (paper Table 2)"`.
    #[serde(default)]
    pub tables: BTreeMap<String, String>,
    #[serde(rename = "system")]
    pub systems: Vec<SystemSpec>,
    #[serde(default)]
    pub analyses: Analyses,
}

/// Data files, relative to the data directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanData {
    pub train_src: String,
    pub train_tgt: String,
    pub dev_src: String,
    pub dev_tgt: String,
    pub test_src: String,
    /// One or more reference files of the test set.
    pub test_refs: Vec<String>,
    pub src_lang: String,
    pub tgt_lang: String,
    /// Extra `cgnmt prepare` arguments (tokenizers, `--limit`, `--max-len`, BPE).
    #[serde(default)]
    pub prepare: Vec<String>,
    /// Further test sets every run also decodes and is scored on (a table each in the report).
    #[serde(default, rename = "extra_test")]
    pub extra_tests: Vec<ExtraTest>,
}

/// A further test set: files relative to the data directory, optionally only its pairs whose (first)
/// reference is longer than a number of words (e.g. a harder, longer half of a test set).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExtraTest {
    /// Short name (letters, digits, `-`): names the run's output files and the report's table.
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub src: String,
    pub refs: Vec<String>,
    /// Keep only the pairs whose first reference has more than this many words (0: every pair).
    #[serde(default)]
    pub min_ref_words: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    /// `section.key=value` settings (as `cgnmt train --set`).
    #[serde(default)]
    pub set: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeSpec {
    pub beam: usize,
}

impl Default for DecodeSpec {
    fn default() -> Self {
        Self { beam: 10 }
    }
}

/// What `--quick` changes: a tiny budget for tests.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuickSpec {
    /// Extra `prepare` arguments (e.g. `--limit 1500`).
    #[serde(default)]
    pub prepare: Vec<String>,
    /// Settings applied after the plan's and the system's.
    #[serde(default)]
    pub set: Vec<String>,
    /// Decode only the first N test sentences (0 = all).
    #[serde(default)]
    pub test_limit: usize,
    /// Seeds in quick mode (default: the first of the plan's).
    #[serde(default)]
    pub seeds: Vec<u64>,
}

/// One row of the paper's tables.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SystemSpec {
    pub name: String,
    /// Table id (a key of `[tables]`).
    pub table: String,
    #[serde(default)]
    pub set: Vec<String>,
    /// The row this one is tested against.
    #[serde(default)]
    pub baseline: Option<String>,
    /// The paper's BLEU for this row (model-spec §9), shown beside ours for reference.
    #[serde(default)]
    pub paper: Option<f64>,
    /// Extra `cgnmt prepare` arguments for this row's data (e.g. BPE): the row trains on its own prepared
    /// directory (rows with the same arguments share one).
    #[serde(default)]
    pub prepare: Vec<String>,
    /// Train this row with only the first N of the run's seeds (e.g. one seed for an ablation).
    #[serde(default)]
    pub seeds: Option<usize>,
    /// The row's models are those trained for another row (named here, listed earlier, without a `from` of
    /// its own): this row trains nothing and only decodes otherwise (`decode`, `average`, `ensemble`).
    #[serde(default)]
    pub from: Option<String>,
    /// Extra `cgnmt translate` arguments for the row's test decoding (e.g. `["--length-penalty", "1"]`).
    #[serde(default)]
    pub decode: Vec<String>,
    /// Decode the average of the last N checkpoints the run kept (`train.keep_checkpoints` ≥ N) instead of
    /// the best one (0: the best).
    #[serde(default)]
    pub average: usize,
    /// With `from`: decode with the ensemble of the source row's models of every seed (one result, named
    /// by the first seed); with `average`, of each seed's average.
    #[serde(default)]
    pub ensemble: bool,
    /// Choose the decoded model and its penalties on dev (`cgnmt select --tune`): `best/`, the average of the
    /// converged tail of the last `average` kept checkpoints (all kept when `average` is 0) and the moving
    /// average (`smoothed/`) are scored on dev, then the chosen one's length and coverage penalties (starting
    /// from those in `decode`); what was chosen and why is in the run's `output.log` and `selection.json`.
    /// Not with `ensemble`.
    #[serde(default)]
    pub choose: bool,
    /// With `choose`: further `cgnmt select` arguments, e.g. `["--tune-longer-than", "6", "--length-ratio",
    /// "0.95,1.05"]` to choose the penalties on dev's longer pairs under a length-ratio constraint.
    #[serde(default)]
    pub select: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analyses {
    #[serde(default)]
    pub gate_correlation: Option<GateCorrelationSpec>,
    #[serde(default)]
    pub gate_histogram: Option<SystemsSpec>,
    #[serde(default)]
    pub context_scaling: Option<ContextScalingSpec>,
    #[serde(default)]
    pub length_groups: Option<LengthGroupsSpec>,
    #[serde(default)]
    pub subjective: Option<SubjectiveSpec>,
    #[serde(default)]
    pub heatmaps: Option<HeatmapSpec>,
    #[serde(default)]
    pub alignment: Vec<AlignmentSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateCorrelationSpec {
    pub system: String,
    pub baseline: String,
    /// Sentences with at least this many source words form the "long" subset.
    #[serde(default = "default_long")]
    pub long: usize,
}

fn default_long() -> usize {
    30
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemsSpec {
    pub systems: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextScalingSpec {
    pub systems: Vec<String>,
    /// `(a, b)` pairs: source-context scale, target-context scale.
    pub scales: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthGroupsSpec {
    pub systems: Vec<String>,
    pub edges: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectiveSpec {
    pub baseline: String,
    pub system: String,
    /// Test sentences sampled for judgement.
    pub sentences: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatmapSpec {
    pub system: String,
    /// 0-based test sentence indices.
    pub sentences: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlignmentSpec {
    pub name: String,
    /// Source and target sentences (tokenised as the gold links index them), relative to the data directory.
    pub src: String,
    pub tgt: String,
    pub gold: String,
    /// The gold links are written target index first.
    #[serde(default)]
    pub target_first: bool,
    pub systems: Vec<String>,
}

impl Plan {
    pub fn load(path: &Path) -> Result<Plan> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the plan", path.display()))?;
        let plan: Plan =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        plan.validate()
            .with_context(|| format!("{}: invalid plan", path.display()))?;
        Ok(plan)
    }

    pub fn system(&self, name: &str) -> Option<&SystemSpec> {
        self.systems.iter().find(|s| s.name == name)
    }

    /// Tables in the order their first row appears.
    pub fn table_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = vec![];
        for s in &self.systems {
            if !ids.contains(&s.table) {
                ids.push(s.table.clone());
            }
        }
        ids
    }

    /// The resolved configuration of a system at a seed: defaults, the plan's settings, the system's, the
    /// quick settings when asked, then the run's own (prepared data, seed, threads, budget).
    pub fn config(&self, sys: &SystemSpec, quick: bool, run_sets: &[String]) -> Result<Config> {
        let mut sets = self.train.set.clone();
        // A row that decodes another row's models has that row's configuration.
        let trained = match &sys.from {
            Some(f) => self.system(f).with_context(|| {
                format!("system {:?}: from: no system is named {f:?}", sys.name)
            })?,
            None => sys,
        };
        sets.extend(trained.set.iter().cloned());
        if quick {
            sets.extend(self.quick.set.iter().cloned());
        }
        sets.extend(run_sets.iter().cloned());
        Config::load(None, &sets).with_context(|| format!("system {:?}", sys.name))
    }

    fn validate(&self) -> Result<()> {
        if self.seeds.is_empty() {
            bail!("seeds: give at least one seed");
        }
        if self.systems.is_empty() {
            bail!("no [[system]]");
        }
        if self.decode.beam == 0 {
            bail!("decode.beam must be at least 1");
        }
        let mut names = BTreeSet::new();
        for s in &self.systems {
            if s.name.trim().is_empty() {
                bail!("a system has an empty name");
            }
            if !names.insert(s.name.as_str()) {
                bail!("system {:?} is listed twice", s.name);
            }
            if !self.tables.is_empty() && !self.tables.contains_key(&s.table) {
                bail!(
                    "system {:?}: table {:?} is not in [tables]",
                    s.name,
                    s.table
                );
            }
            if s.seeds == Some(0) {
                bail!("system {:?}: seeds must be at least 1", s.name);
            }
            match &s.from {
                Some(f) => {
                    let Some(src) = self
                        .systems
                        .iter()
                        .take_while(|x| x.name != s.name)
                        .find(|x| &x.name == f)
                    else {
                        bail!(
                            "system {:?}: from: no earlier system is named {f:?}",
                            s.name
                        );
                    };
                    if src.from.is_some() {
                        bail!(
                            "system {:?}: from {f:?}, which decodes another row's models itself",
                            s.name
                        );
                    }
                    if !s.set.is_empty() || !s.prepare.is_empty() {
                        bail!(
                            "system {:?}: a row with `from` trains nothing: it takes no `set` or `prepare`",
                            s.name
                        );
                    }
                }
                None if s.ensemble => {
                    bail!(
                        "system {:?}: ensemble needs `from` (the row whose seeds' models it joins)",
                        s.name
                    )
                }
                None => {}
            }
            for a in &s.decode {
                if [
                    "-m", "--model", "-i", "--input", "-o", "--output", "--dump", "--beam", "-b",
                ]
                .contains(&a.as_str())
                {
                    bail!(
                        "system {:?}: decode: {a} is set by reproduce itself",
                        s.name
                    );
                }
            }
            if !s.select.is_empty() && !s.choose {
                bail!(
                    "system {:?}: select gives `cgnmt select` arguments: it needs choose = true",
                    s.name
                );
            }
            for a in &s.select {
                if ["--run", "--out", "--tune", "--last", "--beam"].contains(&a.as_str()) {
                    bail!(
                        "system {:?}: select: {a} is set by reproduce itself",
                        s.name
                    );
                }
            }
            // Every system's settings must resolve (unknown keys, bad values) before anything runs.
            self.config(s, false, &[])?;
            self.config(s, true, &[])?;
        }
        let mut test_names = BTreeSet::new();
        for x in &self.data.extra_tests {
            if x.name.is_empty()
                || !x
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                bail!("extra_test {:?}: a name is letters, digits and '-'", x.name);
            }
            if !test_names.insert(x.name.as_str()) {
                bail!("extra_test {:?} is listed twice", x.name);
            }
            if x.refs.is_empty() {
                bail!("extra_test {:?}: give at least one reference file", x.name);
            }
        }
        let known = |what: &str, n: &str| -> Result<()> {
            if names.contains(n) {
                Ok(())
            } else {
                bail!("{what}: no system is named {n:?}")
            }
        };
        for s in &self.systems {
            if let Some(b) = &s.baseline {
                known(&format!("system {:?}: baseline", s.name), b)?;
                if b == &s.name {
                    bail!("system {:?} is its own baseline", s.name);
                }
            }
        }
        let a = &self.analyses;
        if let Some(g) = &a.gate_correlation {
            known("analyses.gate_correlation.system", &g.system)?;
            known("analyses.gate_correlation.baseline", &g.baseline)?;
        }
        if let Some(g) = &a.gate_histogram {
            for n in &g.systems {
                known("analyses.gate_histogram", n)?;
            }
        }
        if let Some(c) = &a.context_scaling {
            for n in &c.systems {
                known("analyses.context_scaling", n)?;
            }
            if c.scales.is_empty() {
                bail!("analyses.context_scaling.scales is empty");
            }
            for &(x, y) in &c.scales {
                if !(x.is_finite() && y.is_finite() && x >= 0.0 && y >= 0.0) {
                    bail!(
                        "analyses.context_scaling.scales: ({x}, {y}) must be non-negative numbers"
                    );
                }
            }
        }
        if let Some(l) = &a.length_groups {
            for n in &l.systems {
                known("analyses.length_groups", n)?;
            }
            cgnmt_eval::analysis::check_edges(&l.edges)
                .map_err(|e| anyhow::anyhow!("analyses.length_groups.edges: {e}"))?;
        }
        if let Some(s) = &a.subjective {
            known("analyses.subjective.baseline", &s.baseline)?;
            known("analyses.subjective.system", &s.system)?;
            if s.sentences == 0 {
                bail!("analyses.subjective.sentences must be at least 1");
            }
        }
        if let Some(h) = &a.heatmaps {
            known("analyses.heatmaps.system", &h.system)?;
        }
        for al in &a.alignment {
            for n in &al.systems {
                known(&format!("analyses.alignment {:?}", al.name), n)?;
            }
        }
        Ok(())
    }
}

/// A directory name for a system: lower-case letters and digits, other runs of characters as `-`.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') {
            s.push('-');
        }
    }
    s.trim_matches('-').to_string()
}

/// FNV-1a (64-bit) of a text, in hex: the identity of a run's configuration.
pub fn fingerprint(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_plans_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for p in [
            "tatoeba.toml",
            "hansards.toml",
            "recipes.toml",
            "gates-modern.toml",
            "gates-modern-hansards.toml",
            "low-resource.toml",
            "deep.toml",
            "deep-hansards.toml",
        ] {
            let plan = Plan::load(&root.join("configs/reproduce").join(p)).unwrap();
            assert!(plan.systems.len() >= 3, "{p}");
            let slugs: BTreeSet<String> = plan.systems.iter().map(|s| slug(&s.name)).collect();
            assert_eq!(slugs.len(), plan.systems.len(), "{p}: slugs collide");
        }
    }

    #[test]
    fn bad_plans_are_refused_with_the_reason() {
        let base = r#"
name = "t"
seeds = [1]
[data]
train_src = "a"
train_tgt = "b"
dev_src = "c"
dev_tgt = "d"
test_src = "e"
test_refs = ["f"]
src_lang = "zh"
tgt_lang = "en"
[[system]]
name = "A"
table = "2"
"#;
        let check = |extra: &str, want: &str| {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("p.toml");
            std::fs::write(&p, format!("{base}{extra}")).unwrap();
            let e = format!("{:#}", Plan::load(&p).unwrap_err());
            assert!(e.contains(want), "{extra:?}: {e}");
        };
        check("baseline = \"B\"\n", "no system is named \"B\"");
        check("set = [\"model.hidden_dim=3\"]\n", "hidden_dim");
        check("colour = 1\n", "unknown field");
        check("[[system]]\nname = \"A\"\ntable = \"2\"\n", "listed twice");
        check(
            "[analyses.context_scaling]\nsystems = [\"A\"]\nscales = [[1.0, -1.0]]\n",
            "non-negative",
        );
        let row = |extra: &str| format!("[[system]]\nname = \"B\"\ntable = \"2\"\n{extra}");
        check(&row("from = \"C\"\n"), "no earlier system is named \"C\"");
        check(
            &row("from = \"A\"\nset = [\"train.seed=2\"]\n"),
            "takes no `set`",
        );
        check(&row("ensemble = true\n"), "ensemble needs `from`");
        check(
            &row("from = \"A\"\ndecode = [\"-m\", \"x\"]\n"),
            "set by reproduce",
        );
        check(&row("seeds = 0\n"), "at least 1");
        check(
            "[[data.extra_test]]\nname = \"a b\"\nsrc = \"x\"\nrefs = [\"y\"]\n",
            "letters, digits",
        );
    }

    #[test]
    fn slugs_and_fingerprints() {
        assert_eq!(
            slug("GRU + both gate, inputs word + state"),
            "gru-both-gate-inputs-word-state"
        );
        assert_eq!(fingerprint(""), "cbf29ce484222325");
        assert_ne!(fingerprint("a"), fingerprint("b"));
    }
}
