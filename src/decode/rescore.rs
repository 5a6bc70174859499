//! `cgnmt rescore`: n-best rescoring. `translate --nbest N` writes each sentence's N best hypotheses as
//! `INDEX ||| TEXT ||| SCORE`; any tool may append features to a line (`||| name=value name=value …`) or
//! write them to a file of one number per n-best line (`--feature NAME=FILE`, e.g. a language model's or a
//! right-to-left model's scores). `rescore` picks, per sentence, the hypothesis with the highest weighted sum
//! of its features (`--weight NAME=W`): `model` (the translation model's log-probability, weight 1 unless
//! given), `words` (the output's words) and every named feature. With the default weights it picks what
//! `translate` would (its first hypothesis of each sentence).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::decode::translator::{ScoreOptions, Translator};

/// One hypothesis of an n-best list with its features.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub sentence: usize,
    pub text: String,
    pub features: BTreeMap<String, f64>,
}

/// Parse an n-best list (`name` for messages): every line's sentence index, text and features (`model`,
/// `words`, and the named ones of a fourth field). Sentences must come in order from 0, each one's lines
/// together, none missing.
pub fn parse_nbest(name: &str, lines: &[String]) -> Result<Vec<Candidate>> {
    let mut out: Vec<Candidate> = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let at = || format!("{name}: line {}", i + 1);
        let fields: Vec<&str> = line.split(" ||| ").collect();
        if fields.len() < 3 || fields.len() > 4 {
            bail!(
                "{}: expected `INDEX ||| TEXT ||| SCORE [||| name=value ...]`, found {} field(s)",
                at(),
                fields.len()
            );
        }
        let sentence: usize = fields[0]
            .trim()
            .parse()
            .with_context(|| format!("{}: sentence index {:?} is not a number", at(), fields[0]))?;
        let expected = match out.last() {
            None => 0,
            Some(p) if p.sentence == sentence => sentence,
            Some(p) => p.sentence + 1,
        };
        if sentence != expected {
            bail!(
                "{}: sentence {sentence} where {expected} was expected (the sentences' lines come in order, \
                 together, from 0)",
                at()
            );
        }
        let model = parse_number(fields[2]).with_context(at)?;
        let text = fields[1].to_string();
        let mut features = BTreeMap::new();
        features.insert("model".to_string(), model);
        features.insert("words".to_string(), text.split_whitespace().count() as f64);
        if let Some(extra) = fields.get(3) {
            for item in extra.split_whitespace() {
                let Some((k, v)) = item.split_once('=') else {
                    bail!("{}: feature {item:?} is not name=value", at());
                };
                if k.is_empty() || k == "model" || k == "words" {
                    bail!("{}: feature name {k:?} is empty or built in", at());
                }
                let v = parse_number(v).with_context(at)?;
                if features.insert(k.to_string(), v).is_some() {
                    bail!("{}: feature {k:?} given twice", at());
                }
            }
        }
        out.push(Candidate {
            sentence,
            text,
            features,
        });
    }
    Ok(out)
}

fn parse_number(s: &str) -> Result<f64> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => bail!("{:?} is not a finite number", s.trim()),
    }
}

/// `NAME=VALUE` of a command-line option.
fn name_value<'a>(option: &str, s: &'a str) -> Result<(&'a str, &'a str)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k, v)),
        _ => bail!("{option} {s:?}: expected NAME=VALUE"),
    }
}

/// Each sentence's best candidate by `Σ weight · feature` (ties: the first, i.e. `translate`'s order). Every
/// candidate must have every weighted feature.
pub fn pick<'a>(
    cands: &'a [Candidate],
    weights: &BTreeMap<String, f64>,
) -> Result<Vec<&'a Candidate>> {
    let mut best: Vec<(&Candidate, f64)> = vec![];
    for (i, c) in cands.iter().enumerate() {
        let mut total = 0.0;
        for (k, w) in weights {
            let Some(v) = c.features.get(k) else {
                bail!("n-best line {}: no feature {k:?} (it has a weight)", i + 1);
            };
            total += w * v;
        }
        match best.get_mut(c.sentence) {
            Some(b) if total > b.1 => *b = (c, total),
            Some(_) => {}
            None => best.push((c, total)),
        }
    }
    Ok(best.into_iter().map(|b| b.0).collect())
}

/// The rescored n-best list `input` (plain or gzipped): with the `features` (`NAME=FILE`, one number per line of
/// the list) added and the `weights` (`NAME=W`) applied, each sentence's best hypothesis, a line each.
pub fn rescore_file(input: &Path, features: &[String], weights: &[String]) -> Result<String> {
    rescore_file_with(input, features, weights, &[], None)
}

/// [`rescore_file`] with more features from models: each `(NAME, translator)` adds the log-probability the
/// model (or ensemble) gives every hypothesis's text given its sentence's source line in `sources`
/// ([`Translator::score`], the texts tokenised as the model tokenises raw text).
pub fn rescore_file_with(
    input: &Path,
    features: &[String],
    weights: &[String],
    models: &[(String, &Translator)],
    sources: Option<&[String]>,
) -> Result<String> {
    let name = input.display().to_string();
    let lines = cgnmt_data::corpus::read_lines(input)?;
    let mut cands = parse_nbest(&name, &lines)?;
    if !models.is_empty() {
        let Some(sources) = sources else {
            bail!("a model feature needs the source sentences the n-best list translates");
        };
        let sentences = cands.last().map_or(0, |c| c.sentence + 1);
        if sources.len() != sentences {
            bail!(
                "the sources have {} lines, the n-best list {name} {sentences} sentences",
                sources.len()
            );
        }
        let srcs: Vec<String> = cands.iter().map(|c| sources[c.sentence].clone()).collect();
        let tgts: Vec<String> = cands.iter().map(|c| c.text.clone()).collect();
        for (k, tr) in models {
            if k == "model" || k == "words" {
                bail!("model feature {k:?}: {k:?} is built in");
            }
            let scores = tr
                .score(&srcs, &tgts, &ScoreOptions::default())
                .with_context(|| format!("scoring {name} with the model {k:?}"))?;
            for (i, (c, s)) in cands.iter_mut().zip(scores).enumerate() {
                if c.features.insert(k.to_string(), s.score).is_some() {
                    bail!(
                        "model feature {k}: {name} line {} has a feature of that name already",
                        i + 1
                    );
                }
            }
        }
    }
    for f in features {
        let (k, path) = name_value("--feature", f)?;
        if k == "model" || k == "words" {
            bail!("--feature {f:?}: {k:?} is built in");
        }
        let values = cgnmt_data::corpus::read_lines(Path::new(path))?;
        if values.len() != cands.len() {
            bail!(
                "--feature {k}: {path} has {} lines, the n-best list {name} {}",
                values.len(),
                cands.len()
            );
        }
        for (i, (c, v)) in cands.iter_mut().zip(&values).enumerate() {
            let v = parse_number(v).with_context(|| format!("{path}: line {}", i + 1))?;
            if c.features.insert(k.to_string(), v).is_some() {
                bail!(
                    "--feature {k}: {name} line {} has a feature of that name already",
                    i + 1
                );
            }
        }
    }
    let mut weighted = BTreeMap::from([("model".to_string(), 1.0)]);
    for w in weights {
        let (k, v) = name_value("--weight", w)?;
        let v = parse_number(v).with_context(|| format!("--weight {w:?}"))?;
        weighted.insert(k.to_string(), v);
    }
    weighted.retain(|_, w| *w != 0.0);
    let best = pick(&cands, &weighted).with_context(|| name.clone())?;
    let mut text = String::new();
    for c in best {
        text.push_str(&c.text);
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(String::from).collect()
    }

    #[test]
    fn picks_by_weighted_features_and_refuses_bad_lists() {
        let nb = lines(
            "0 ||| a b ||| -1.0 ||| lm=-5\n0 ||| a b c ||| -1.5 ||| lm=-2\n1 ||| x ||| -0.5 ||| lm=-1",
        );
        let c = parse_nbest("nb", &nb).unwrap();
        assert_eq!(c[1].features["words"], 3.0);
        let w = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let texts = |ws: &[(&str, f64)]| -> Vec<String> {
            pick(&c, &w(ws))
                .unwrap()
                .iter()
                .map(|c| c.text.clone())
                .collect()
        };
        assert_eq!(texts(&[("model", 1.0)]), ["a b", "x"]);
        // −1 − 0.5·5 = −3.5 against −1.5 − 0.5·2 = −2.5.
        assert_eq!(texts(&[("model", 1.0), ("lm", 0.5)]), ["a b c", "x"]);
        assert_eq!(texts(&[("model", 1.0), ("words", 0.6)]), ["a b c", "x"]);
        // Ties keep the first.
        assert_eq!(texts(&[]), ["a b", "x"]);
        let err = |s: &str| format!("{:#}", parse_nbest("nb", &lines(s)).unwrap_err());
        assert!(err("0 ||| a ||| -1\n2 ||| b ||| -1").contains("nb: line 2: sentence 2 where 1"));
        assert!(err("1 ||| a ||| -1").contains("line 1: sentence 1 where 0"));
        assert!(err("0 ||| a").contains("line 1: expected"));
        assert!(err("0 ||| a ||| x").contains("\"x\" is not a finite number"));
        assert!(err("0 ||| a ||| -1 ||| lm").contains("not name=value"));
        assert!(err("0 ||| a ||| -1 ||| model=2").contains("built in"));
        let nolm = parse_nbest("nb", &lines("0 ||| a ||| -1")).unwrap();
        assert!(
            format!("{:#}", pick(&nolm, &w(&[("lm", 1.0)])).unwrap_err())
                .contains("no feature \"lm\"")
        );
    }
}
