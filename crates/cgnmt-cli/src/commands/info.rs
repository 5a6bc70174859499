//! `cgnmt info`: the parameter count of a configuration's model, per component.

use std::path::PathBuf;

use anyhow::Result;

use cgnmt::config::Config;

#[derive(clap::Args)]
pub struct InfoArgs {
    #[arg(short, long)]
    config: Option<PathBuf>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

pub fn run(a: InfoArgs) -> Result<()> {
    let cfg = Config::load(a.config.as_deref(), &a.sets)?;
    let counts = cgnmt::model::init::parameter_counts(&cfg)?;
    println!(
        "model: decoder {:?}, context_gate {:?}, gate_form {:?}, coverage {:?}; E {} H {} V {}+2 / {}+2",
        cfg.model.decoder,
        cfg.model.context_gate,
        cfg.model.gate_form,
        cfg.model.coverage,
        cfg.model.embedding_dim,
        cfg.model.hidden_dim,
        cfg.data.src_vocab_size,
        cfg.data.tgt_vocab_size
    );
    let m = &cfg.model;
    if m.encoder_layers > 1 || m.decoder_transition_depth > 1 {
        println!(
            "depth: {} encoder layer(s){}{}, {} transition(s) per decoder step",
            m.encoder_layers,
            match (m.encoder_layers > 1, m.encoder_type) {
                (true, cgnmt::config::EncoderType::BiUnidirectional) => {
                    " (bidirectional, then unidirectional)"
                }
                _ => "",
            },
            if m.encoder_layers > 1 && m.residual {
                " with residual connections"
            } else {
                ""
            },
            m.decoder_transition_depth
        );
    }
    if m.layer_norm {
        let mut plain = cfg.clone();
        plain.model.layer_norm = false;
        let without: usize = cgnmt::model::init::parameter_counts(&plain)?
            .iter()
            .map(|(_, n)| n)
            .sum();
        let with: usize = counts.iter().map(|(_, n)| n).sum();
        println!(
            "layer normalisation: every recurrent cell's products, the attention's keys and query, the readout's \
             terms ({} gains and biases); runs step by step, with the fused row ops but no fused sequence ops",
            with - without
        );
    }
    for (k, n) in &counts {
        println!("{k:<28} {n:>12}  ({:.2}M)", *n as f64 / 1e6);
    }
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    println!(
        "{:<28} {:>12}  ({:.1}M)",
        "total",
        total,
        total as f64 / 1e6
    );
    Ok(())
}
