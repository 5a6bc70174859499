//! Subjective evaluation (paper Table 3): two systems' outputs shown to raters in a blinded order, their
//! adequacy and fluency judgements stored durably, and the report.
//!
//! - A **pairs file** (`pairs.jsonl`, one JSON object a line: `id`, `line`, `source`, `references`, `outputs`
//!   [first, second]) holds the sample as raters see it; the **key file** (`key.jsonl`: `id`, `line`,
//!   `systems` [first, second], optionally `seeds`) says which system wrote which output. `cgnmt eval-pairs`
//!   and `cgnmt reproduce` write both with [`blind_sample`].
//! - The **judgement store** ([`Store`], SQLite in WAL mode with full syncs) keeps the pairs file it was made
//!   for and one row per judgement (rater, item, adequacy and fluency 1–5 of each output, preference); a row is
//!   on disk when the page is told it was stored. `cgnmt serve --eval-db` serves the page (`/eval`).
//! - `cgnmt eval-report DB --key key.jsonl` unblinds the latest judgement of each rater and item and prints the
//!   mean scores and the better / equal / worse shares with the sign test ([`report`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One blinded item as raters see it (fields in the file's key order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairItem {
    pub id: usize,
    /// Line of the test set (0-based).
    pub line: usize,
    /// The two outputs in the order shown.
    pub outputs: [String; 2],
    pub references: Vec<String>,
    pub source: String,
}

/// Which system wrote which output of an item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyItem {
    pub id: usize,
    pub line: usize,
    /// The training seeds of the two outputs' models (written by `reproduce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeds: Option<[u64; 2]>,
    pub systems: [String; 2],
}

/// One system's outputs for the sample.
pub struct SystemOutputs<'a> {
    pub name: &'a str,
    pub lines: &'a [String],
}

/// A blinded sample of `n` test lines (chosen and ordered by `seed`): each item's two outputs in a random
/// order. Fails when the systems' outputs, the source and the references differ in length.
pub fn blind_sample(
    src: &[String],
    refs: &[Vec<String>],
    a: &SystemOutputs,
    b: &SystemOutputs,
    n: usize,
    seed: u64,
) -> Result<(Vec<PairItem>, Vec<KeyItem>)> {
    for (what, len) in [(a.name, a.lines.len()), (b.name, b.lines.len())]
        .into_iter()
        .chain(refs.iter().map(|r| ("a reference", r.len())))
    {
        if len != src.len() {
            bail!(
                "{what} has {len} lines but the source has {}: the files must be line-aligned",
                src.len()
            );
        }
    }
    if a.name == b.name {
        bail!("the two systems have the same name {:?}", a.name);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ids: Vec<usize> = (0..src.len()).collect();
    ids.shuffle(&mut rng);
    ids.truncate(n.min(src.len()));
    ids.sort_unstable();
    let (mut pairs, mut key) = (vec![], vec![]);
    for (k, &i) in ids.iter().enumerate() {
        let swap = rng.random::<bool>();
        let (first, second) = if swap { (b, a) } else { (a, b) };
        pairs.push(PairItem {
            id: k,
            line: i,
            outputs: [first.lines[i].clone(), second.lines[i].clone()],
            references: refs.iter().map(|r| r[i].clone()).collect(),
            source: src[i].clone(),
        });
        key.push(KeyItem {
            id: k,
            line: i,
            seeds: None,
            systems: [first.name.to_string(), second.name.to_string()],
        });
    }
    Ok((pairs, key))
}

/// JSON lines of `items`.
pub fn to_jsonl<T: Serialize>(items: &[T]) -> String {
    let mut s = String::new();
    for it in items {
        s += &serde_json::to_string(it).expect("plain data serialises");
        s.push('\n');
    }
    s
}

/// Parse JSON lines; errors name the file and line. Item ids must be 0, 1, 2, … in order.
fn parse_jsonl<T: for<'de> Deserialize<'de>>(
    text: &str,
    path: &Path,
    id: impl Fn(&T) -> usize,
) -> Result<Vec<T>> {
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let it: T = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a valid item", path.display(), n + 1))?;
        if id(&it) != out.len() {
            bail!(
                "{}:{}: item id {} where {} was expected (ids count 0, 1, 2, … in order)",
                path.display(),
                n + 1,
                id(&it),
                out.len()
            );
        }
        out.push(it);
    }
    if out.is_empty() {
        bail!("{}: no items", path.display());
    }
    Ok(out)
}

pub fn parse_pairs(text: &str, path: &Path) -> Result<Vec<PairItem>> {
    parse_jsonl(text, path, |p: &PairItem| p.id)
}

pub fn read_key(path: &Path) -> Result<Vec<KeyItem>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    parse_jsonl(&text, path, |k: &KeyItem| k.id)
}

/// A system named on the command line as `NAME=FILE`, or as `FILE` (named after the file's stem).
pub fn named_system(arg: &str) -> (String, PathBuf) {
    match arg.split_once('=') {
        Some((n, f)) if !n.is_empty() => (n.to_string(), PathBuf::from(f)),
        _ => {
            let f = PathBuf::from(arg);
            let n = f
                .file_stem()
                .map_or_else(|| arg.to_string(), |x| x.to_string_lossy().into_owned());
            (n, f)
        }
    }
}

/// The blinded sample of `sentences` lines ([`blind_sample`]) of two systems' output files (`(name, file)`)
/// for the source file `src`, with the reference files `refs` shown to raters; every file must have as many
/// lines as the source (an error names the one that does not).
pub fn sample_files(
    src: &Path,
    systems: &[(String, PathBuf); 2],
    refs: &[PathBuf],
    sentences: usize,
    seed: u64,
) -> Result<(Vec<PairItem>, Vec<KeyItem>)> {
    let src_lines = cgnmt_data::corpus::read_lines(src)?;
    // A file's lines, which must be as many as the source's.
    let read = |p: &Path| -> Result<Vec<String>> {
        let lines = cgnmt_data::corpus::read_lines(p)?;
        if lines.len() != src_lines.len() {
            bail!(
                "{}: {} lines, but the source {} has {}: the files must be line-aligned",
                p.display(),
                lines.len(),
                src.display(),
                src_lines.len()
            );
        }
        Ok(lines)
    };
    let (x, y) = (read(&systems[0].1)?, read(&systems[1].1)?);
    let refs = refs.iter().map(|r| read(r)).collect::<Result<Vec<_>>>()?;
    blind_sample(
        &src_lines,
        &refs,
        &SystemOutputs {
            name: &systems[0].0,
            lines: &x,
        },
        &SystemOutputs {
            name: &systems[1].0,
            lines: &y,
        },
        sentences,
        seed,
    )
}

/// A rater's judgement of one item: scores of the first and second output as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Judgement {
    pub rater: String,
    pub item: usize,
    pub adequacy: [u8; 2],
    pub fluency: [u8; 2],
    /// "first", "second" or "equal".
    pub preference: String,
}

impl Judgement {
    /// A message naming what is wrong, if anything.
    pub fn check(&self, items: usize) -> std::result::Result<(), String> {
        let rater = self.rater.trim();
        if rater.is_empty() || rater.chars().count() > 100 {
            return Err("rater: a name of 1 to 100 characters is needed".into());
        }
        if self.item >= items {
            return Err(format!(
                "item {}: the pairs file has items 0 to {}",
                self.item,
                items - 1
            ));
        }
        for (what, v) in [("adequacy", self.adequacy), ("fluency", self.fluency)] {
            if v.iter().any(|&x| !(1..=5).contains(&x)) {
                return Err(format!("{what}: scores are 1 to 5 (got {v:?})"));
            }
        }
        if !["first", "second", "equal"].contains(&self.preference.as_str()) {
            return Err(format!(
                "preference {:?}: one of \"first\", \"second\", \"equal\"",
                self.preference
            ));
        }
        Ok(())
    }
}

/// The judgement store: an SQLite database in WAL mode (every commit synced), holding the pairs file it
/// was made for.
pub struct Store {
    conn: rusqlite::Connection,
    path: PathBuf,
    pub items: Vec<PairItem>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS judgement (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    rater TEXT NOT NULL,
    item INTEGER NOT NULL,
    adequacy_first INTEGER NOT NULL CHECK (adequacy_first BETWEEN 1 AND 5),
    fluency_first INTEGER NOT NULL CHECK (fluency_first BETWEEN 1 AND 5),
    adequacy_second INTEGER NOT NULL CHECK (adequacy_second BETWEEN 1 AND 5),
    fluency_second INTEGER NOT NULL CHECK (fluency_second BETWEEN 1 AND 5),
    preference TEXT NOT NULL CHECK (preference IN ('first', 'second', 'equal')),
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX IF NOT EXISTS judgement_rater ON judgement (rater, item);
";

impl Store {
    /// Open (or create) the store at `path`. A new store needs `pairs`; an existing one keeps the pairs it
    /// was made for, and refuses a different pairs file.
    pub fn open(path: &Path, pairs: Option<&Path>) -> Result<Self> {
        let ctx = || format!("{}: cannot open the judgement database", path.display());
        let conn = rusqlite::Connection::open(path).with_context(ctx)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .with_context(ctx)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .with_context(ctx)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .with_context(ctx)?;
        conn.execute_batch(SCHEMA).with_context(ctx)?;
        let stored: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'pairs'", [], |r| {
                r.get(0)
            })
            .map(Some)
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })
            .with_context(ctx)?;
        let given = pairs
            .map(|p| {
                std::fs::read_to_string(p).with_context(|| format!("{}: cannot read", p.display()))
            })
            .transpose()?;
        let (text, new) = match (stored, given) {
            (None, None) => bail!(
                "{}: a new judgement database needs the pairs file to judge (--eval-pairs)",
                path.display()
            ),
            (Some(s), Some(g)) if s != g => bail!(
                "{}: this database holds the judgements of another pairs file than {}; use a new --eval-db",
                path.display(),
                pairs.map(|p| p.display().to_string()).unwrap_or_default()
            ),
            (Some(s), _) => (s, false),
            (None, Some(g)) => (g, true),
        };
        let items = parse_pairs(&text, pairs.unwrap_or(path))?;
        if new {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('pairs', ?1)",
                [&text],
            )
            .with_context(ctx)?;
        }
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            items,
        })
    }

    /// Store one judgement (checked first); returns its row id once it is on disk.
    pub fn add(&self, j: &Judgement) -> Result<i64> {
        if let Err(e) = j.check(self.items.len()) {
            bail!("{e}");
        }
        self.conn
            .execute(
                "INSERT INTO judgement (rater, item, adequacy_first, fluency_first, adequacy_second, \
                 fluency_second, preference) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                rusqlite::params![
                    j.rater.trim(),
                    j.item as i64,
                    j.adequacy[0],
                    j.fluency[0],
                    j.adequacy[1],
                    j.fluency[1],
                    j.preference
                ],
            )
            .with_context(|| format!("{}: cannot store the judgement", self.path.display()))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// The items a rater has judged (ascending).
    pub fn judged(&self, rater: &str) -> Result<Vec<usize>> {
        let mut st = self
            .conn
            .prepare("SELECT DISTINCT item FROM judgement WHERE rater = ?1 ORDER BY item")?;
        let rows = st.query_map([rater.trim()], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .collect::<rusqlite::Result<Vec<i64>>>()?
            .into_iter()
            .map(|x| x as usize)
            .collect())
    }

    /// The latest judgement of every rater and item, ordered by rater and item.
    pub fn latest(&self) -> Result<Vec<Judgement>> {
        let mut st = self.conn.prepare(
            "SELECT rater, item, adequacy_first, fluency_first, adequacy_second, fluency_second, preference \
             FROM judgement j WHERE id = (SELECT MAX(id) FROM judgement k WHERE k.rater = j.rater AND k.item = j.item) \
             ORDER BY rater, item",
        )?;
        let rows = st.query_map([], |r| {
            Ok(Judgement {
                rater: r.get(0)?,
                item: r.get::<_, i64>(1)? as usize,
                adequacy: [r.get(2)?, r.get(4)?],
                fluency: [r.get(3)?, r.get(5)?],
                preference: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Rows stored in all (every judgement, re-judgements included).
    pub fn rows(&self) -> Result<usize> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM judgement", [], |r| r.get::<_, i64>(0))?
            as usize)
    }
}

/// Table 3 of the paper from the judgements: each system's mean adequacy and fluency, and for the system
/// against the baseline the share of judgements where it was better / equal / worse with the sign test.
#[derive(Debug, Serialize)]
pub struct Report {
    pub judgements: usize,
    pub items: usize,
    pub raters: usize,
    pub baseline: String,
    pub system: String,
    /// Mean adequacy and fluency of (baseline, system).
    pub adequacy: [f64; 2],
    pub fluency: [f64; 2],
    pub comparisons: Vec<Comparison>,
}

#[derive(Debug, Serialize)]
pub struct Comparison {
    /// "adequacy", "fluency" or "preference".
    pub criterion: String,
    pub better: usize,
    pub equal: usize,
    pub worse: usize,
    /// Two-sided sign test on better against worse (ties left out).
    pub p_value: f64,
}

/// Unblind the latest judgements with the key; `baseline` names one of the key's two systems (default: the
/// first in alphabetical order).
pub fn report(js: &[Judgement], key: &[KeyItem], baseline: Option<&str>) -> Result<Report> {
    let mut names: Vec<&str> = key
        .iter()
        .flat_map(|k| k.systems.iter().map(String::as_str))
        .collect();
    names.sort_unstable();
    names.dedup();
    if names.len() != 2 {
        bail!(
            "the key names {} systems ({}); a comparison needs two",
            names.len(),
            names.join(", ")
        );
    }
    let base = match baseline {
        Some(b) if names.contains(&b) => b,
        Some(b) => bail!(
            "--baseline {b:?} is not one of the key's systems ({})",
            names.join(", ")
        ),
        None => names[0],
    };
    let sys = if names[0] == base { names[1] } else { names[0] };
    let mut sums = [[0f64; 2]; 2];
    let mut cmp = [[0usize; 3]; 3];
    let mut items = std::collections::BTreeSet::new();
    let mut raters = std::collections::BTreeSet::new();
    for j in js {
        let Some(k) = key.get(j.item) else {
            bail!(
                "judgement of item {} by {:?}: the key has items 0 to {}",
                j.item,
                j.rater,
                key.len().saturating_sub(1)
            );
        };
        // Index of the baseline's output among the two shown.
        let bi = usize::from(k.systems[0] != base);
        let si = 1 - bi;
        sums[0][0] += f64::from(j.adequacy[bi]);
        sums[0][1] += f64::from(j.adequacy[si]);
        sums[1][0] += f64::from(j.fluency[bi]);
        sums[1][1] += f64::from(j.fluency[si]);
        let tally = |c: &mut [usize; 3], s: u8, b: u8| {
            c[match s.cmp(&b) {
                std::cmp::Ordering::Greater => 0,
                std::cmp::Ordering::Equal => 1,
                std::cmp::Ordering::Less => 2,
            }] += 1
        };
        tally(&mut cmp[0], j.adequacy[si], j.adequacy[bi]);
        tally(&mut cmp[1], j.fluency[si], j.fluency[bi]);
        let pref = match (j.preference.as_str(), si) {
            ("equal", _) => 1,
            ("first", 0) | ("second", 1) => 0,
            _ => 2,
        };
        cmp[2][pref] += 1;
        items.insert(j.item);
        raters.insert(j.rater.clone());
    }
    let n = js.len();
    let mean = |s: f64| if n == 0 { f64::NAN } else { s / n as f64 };
    let comparisons = ["adequacy", "fluency", "preference"]
        .iter()
        .zip(cmp)
        .map(|(c, [b, e, w])| Comparison {
            criterion: c.to_string(),
            better: b,
            equal: e,
            worse: w,
            p_value: cgnmt_eval::significance::binomial_two_sided(b.min(w), b + w),
        })
        .collect();
    Ok(Report {
        judgements: n,
        items: items.len(),
        raters: raters.len(),
        baseline: base.to_string(),
        system: sys.to_string(),
        adequacy: [mean(sums[0][0]), mean(sums[0][1])],
        fluency: [mean(sums[1][0]), mean(sums[1][1])],
        comparisons,
    })
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Subjective evaluation (paper Table 3): {} judgements of {} items by {} rater(s); latest judgement per rater and item",
            self.judgements, self.items, self.raters
        )?;
        let w = self.baseline.len().max(self.system.len()).max(6);
        writeln!(f, "\n{:w$}  adequacy  fluency", "system")?;
        for (i, name) in [&self.baseline, &self.system].iter().enumerate() {
            writeln!(
                f,
                "{name:w$}  {:>8.2}  {:>7.2}",
                self.adequacy[i], self.fluency[i]
            )?;
        }
        writeln!(f, "\n{} against {}:", self.system, self.baseline)?;
        writeln!(
            f,
            "{:10}  {:>7}  {:>7}  {:>7}  sign test p",
            "", "better", "equal", "worse"
        )?;
        let n = self.judgements.max(1) as f64;
        for c in &self.comparisons {
            writeln!(
                f,
                "{:10}  {:>6.1}%  {:>6.1}%  {:>6.1}%  {:.3}",
                c.criterion,
                100.0 * c.better as f64 / n,
                100.0 * c.equal as f64 / n,
                100.0 * c.worse as f64 / n,
                c.p_value
            )?;
        }
        Ok(())
    }
}

/// The report of the judgements stored in the database `db` (`cgnmt serve --eval-db`), unblinded with the
/// key file `key` written beside its pairs file; `baseline` names the baseline system (default: the first of
/// the key's two names in alphabetical order).
pub fn report_of_store(db: &Path, key: &Path, baseline: Option<&str>) -> Result<Report> {
    if !db.is_file() {
        bail!("{}: no such judgement database", db.display());
    }
    let store = Store::open(db, None)?;
    let items = read_key(key)?;
    if items.len() != store.items.len()
        || items
            .iter()
            .zip(&store.items)
            .any(|(k, p)| k.line != p.line)
    {
        bail!(
            "{}: this key does not belong to the pairs file stored in {} (items or test lines differ)",
            key.display(),
            db.display()
        );
    }
    report(&store.latest()?, &items, baseline)
}
