//! A deep model (`model.encoder_layers`, `model.decoder_transition_depth`) through the command line: it trains,
//! resumes to the same parameters, and every decoding path reads it — exact beam search, `--int8`,
//! `--shortlist`, an ensemble, `--dump` — as do `align` and `info`.

use crate::common::*;

#[test]
fn a_deep_model_trains_resumes_and_decodes_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    // Straight to 12 updates, and 6 then resumed to 12: the same parameters, bit for bit.
    let a = tmp.path().join("a");
    run_args_ok(&deep_train_args(&prepared, &a, 12, &[]));
    let b = tmp.path().join("b");
    run_args_ok(&deep_train_args(&prepared, &b, 6, &[]));
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        b.to_str().unwrap(),
        "--set",
        "train.max_steps=12",
    ]);
    let (wa, wb) = (saved_weights(&a), saved_weights(&b));
    for name in [
        "encoder.layer2.fwd.U_ru",
        "encoder.layer2.bwd.W",
        "decoder.cell.deep2.U",
        "decoder.cell.deep2.b",
    ] {
        assert!(wa.contains_key(name), "{name} saved");
    }
    assert_eq!(wa, wb, "a resumed deep run equals the uninterrupted one");

    decodes_everywhere(tmp.path(), &prepared, &a.join("last"), &b.join("last"));
    // `info` names the depth and counts the new parameters.
    let info = run_ok(&[
        "info",
        "--set",
        "model.encoder_layers=3",
        "--set",
        "model.decoder_transition_depth=2",
    ]);
    assert!(
        info.contains(
            "depth: 3 encoder layer(s) with residual connections, 2 transition(s) per decoder step"
        ),
        "{info}"
    );
    assert!(
        info.contains("encoder.layer2") && info.contains("encoder.layer3"),
        "{info}"
    );
}
