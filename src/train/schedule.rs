//! The learning rate of each update (`train.lr_warmup`, `train.lr_decay`, `train.lr_min`): a pure function of
//! the configuration, the update's number and the training state (the rollbacks' halvings, the stalled
//! decays), so that a resumed run, every MPI rank and a rolled-back run use the same rates.

use crate::config::{LrDecay, TrainConfig};
use crate::train::checkpoint::TrainState;

/// The learning rate of update `t` (1-based): `train.learning_rate` × the rollbacks' scale × the decay
/// (`inv-sqrt`: `sqrt(N / max(t, N))`; `stalled`: the state's product of decays), floored at `train.lr_min`,
/// then × the warm-up's `min(1, t / lr_warmup)`. Without a schedule: `learning_rate × lr_scale`.
pub fn learning_rate(tc: &TrainConfig, state: &TrainState, t: u64) -> f64 {
    let base = tc.learning_rate * state.lr_scale;
    let t = t.max(1) as f64;
    let decay = match tc.lr_decay {
        LrDecay::None => 1.0,
        LrDecay::InvSqrt => {
            let start = if tc.lr_decay_start > 0 {
                tc.lr_decay_start
            } else {
                tc.lr_warmup.max(1)
            } as f64;
            (start / t.max(start)).sqrt()
        }
        LrDecay::Stalled => state.lr_decay_scale,
    };
    let mut lr = base * decay;
    if decay < 1.0 && tc.lr_min > 0.0 {
        lr = lr.max(tc.lr_min.min(base));
    }
    if tc.lr_warmup > 0 && t < tc.lr_warmup as f64 {
        lr *= t / tc.lr_warmup as f64;
    }
    lr
}

/// After an evaluation: with `lr_decay = "stalled"`, one more decay each time the evaluations without
/// improvement reach a multiple of `lr_decay_patience`.
pub fn after_evaluation(tc: &TrainConfig, state: &mut TrainState) {
    if tc.lr_decay == LrDecay::Stalled
        && state.evals_without_improvement > 0
        && state.evals_without_improvement % tc.lr_decay_patience as u64 == 0
    {
        state.lr_decay_scale *= tc.lr_decay_factor;
    }
}

/// Whether the configuration has a schedule (the log then records each window's learning rate).
pub fn is_scheduled(tc: &TrainConfig) -> bool {
    tc.lr_warmup > 0 || tc.lr_decay != LrDecay::None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sets: &[&str]) -> TrainConfig {
        let mut all = vec![
            "train.optimizer=adam".to_string(),
            "train.learning_rate=0.01".into(),
        ];
        all.extend(sets.iter().map(|s| s.to_string()));
        crate::config::Config::load(None, &all).unwrap().train
    }

    #[test]
    fn without_a_schedule_the_rate_is_the_configured_one_times_the_rollbacks() {
        let tc = cfg(&[]);
        let mut st = TrainState::default();
        assert_eq!(learning_rate(&tc, &st, 1), 0.01);
        assert_eq!(learning_rate(&tc, &st, 1_000_000), 0.01);
        st.lr_scale = 0.25;
        assert_eq!(learning_rate(&tc, &st, 7), 0.01 * 0.25);
        assert!(!is_scheduled(&tc));
    }

    #[test]
    fn warm_up_then_inverse_square_root_with_a_floor() {
        let tc = cfg(&[
            "train.lr_warmup=100",
            "train.lr_decay=\"inv-sqrt\"",
            "train.lr_min=0.002",
        ]);
        let st = TrainState::default();
        let lr = |t| learning_rate(&tc, &st, t);
        assert!((lr(1) - 0.0001).abs() < 1e-15 && (lr(50) - 0.005).abs() < 1e-15);
        assert_eq!(lr(100), 0.01);
        assert!(
            (lr(400) - 0.005).abs() < 1e-15,
            "sqrt(100 / 400) = 1/2: {}",
            lr(400)
        );
        assert_eq!(
            lr(2_500),
            0.002,
            "sqrt(100 / 2500) = 1/5 and the floor is 0.002"
        );
        assert_eq!(lr(1_000_000), 0.002);
        let from = cfg(&["train.lr_decay=\"inv-sqrt\"", "train.lr_decay_start=1000"]);
        assert_eq!(learning_rate(&from, &st, 500), 0.01);
        assert!((learning_rate(&from, &st, 4000) - 0.005).abs() < 1e-15);
    }

    #[test]
    fn stalled_decay_multiplies_after_every_patience_evaluations_without_improvement() {
        let tc = cfg(&[
            "train.lr_decay=\"stalled\"",
            "train.lr_decay_factor=0.5",
            "train.lr_decay_patience=2",
            "train.lr_min=0.003",
            "train.eval_every=10",
        ]);
        let mut st = TrainState::default();
        for (without, want) in [
            (0, 0.01),
            (1, 0.01),
            (2, 0.005),
            (3, 0.005),
            (4, 0.003),
            (6, 0.003),
        ] {
            st.evals_without_improvement = without;
            after_evaluation(&tc, &mut st);
            assert_eq!(
                learning_rate(&tc, &st, 50),
                want,
                "after {without} evaluations"
            );
        }
        assert_eq!(st.lr_decay_scale, 0.125, "three decays (at 2, 4 and 6)");
        // Adadelta has no learning rate to schedule; stalled decay needs evaluations.
        for bad in [
            vec!["train.optimizer=adadelta", "train.lr_warmup=10"],
            vec![
                "train.optimizer=adam",
                "train.lr_decay=\"stalled\"",
                "train.eval_every=0",
            ],
            vec!["train.optimizer=adam", "train.lr_decay_factor=1.5"],
            vec!["train.optimizer=adam", "train.lr_decay=\"cosine\""],
        ] {
            let sets: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(crate::config::Config::load(None, &sets).is_err(), "{bad:?}");
        }
    }
}
