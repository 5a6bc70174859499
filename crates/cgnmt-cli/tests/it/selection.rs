//! Model selection by another dev score (`train.select_by`): every evaluation logs mteval BLEU, smoothed
//! BLEU and chrF; `best/` is the evaluation with the highest score of the chosen kind.

use crate::common;

use common::prepare;

fn evals(log: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("eval").is_some())
        .collect()
}

#[test]
fn best_checkpoint_is_the_evaluation_with_the_highest_selected_score() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    for (by, key) in [
        ("chrf", "dev_chrf"),
        ("smoothed-bleu", "dev_bleu_smoothed"),
        ("bleu", "dev_bleu"),
    ] {
        let run = tmp.path().join(by);
        common::train_tiny(
            &prepared,
            &run,
            &[
                "model.embedding_dim=48",
                "model.hidden_dim=64",
                "model.attention_dim=48",
                "train.batch_size=32",
                "train.max_steps=180",
                "train.eval_every=30",
                "train.eval_max_sentences=80",
                "train.eval_beam=2",
                "train.patience=0",
                "train.optimizer=adam",
                "train.learning_rate=0.005",
                &format!("train.select_by={by:?}"),
            ],
        );
        let ev = evals(&run.join("train.log"));
        assert_eq!(ev.len(), 6, "{by}");
        let scores: Vec<f64> = ev.iter().map(|e| e[key].as_f64().unwrap()).collect();
        for e in &ev {
            let (b, s, c) = (
                e["dev_bleu"].as_f64().unwrap(),
                e["dev_bleu_smoothed"].as_f64().unwrap(),
                e["dev_chrf"].as_f64().unwrap(),
            );
            assert!(s >= b && (0.0..=100.0).contains(&c), "{e}");
        }
        // The first evaluation with the highest score (a later tie is not an improvement).
        let best = (0..scores.len()).fold(0, |m, i| if scores[i] > scores[m] { i } else { m });
        let state = cgnmt::train::checkpoint::load_state(&run.join("last")).unwrap();
        assert!(run.join("best/model.safetensors").is_file());
        assert_eq!(
            state.best_step,
            ev[best]["eval"].as_u64().unwrap(),
            "{by}: {scores:?}"
        );
        assert_eq!(state.best_selection, Some(scores[best]), "{by}");
        assert_eq!(state.best_bleu, ev[best]["dev_bleu"].as_f64(), "{by}");
        if by == "chrf" {
            // chrF tells these early models apart (it is not the same at every evaluation).
            assert!(scores.iter().any(|&x| x != scores[0]), "{scores:?}");
        }
    }
}
