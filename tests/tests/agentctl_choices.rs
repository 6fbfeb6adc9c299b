//! agentctl's `--kind` and `--verdict` values (blockjanitor-ctl, which never depends on the
//! agent) against the agent's own enums: the same names in the same order, the same help and
//! the same aliases, and each standing for the wire value the agent's server sends for it. A
//! kind or verdict the agent gains fails here until agentctl learns it.

use blockjanitor::engine::wire as convert;
use blockjanitor::judge::Verdict;
use blockjanitor::model::DeviceKind;
use blockjanitor_ctl::cli::choices::{KindChoice, VerdictChoice};
use clap::builder::PossibleValue;
use clap::ValueEnum;

/// Name, help and aliases of each value, in order.
fn described<E: ValueEnum>() -> Vec<(String, Option<String>, Vec<String>)> {
    E::value_variants()
        .iter()
        .map(|v| {
            let p: PossibleValue = v.to_possible_value().expect("every value is named");
            let help = p.get_help().map(ToString::to_string);
            let names = p.get_name_and_aliases().map(str::to_owned).collect();
            (p.get_name().to_owned(), help, names)
        })
        .collect()
}

#[test]
fn kinds_are_the_agents_kinds() {
    assert_eq!(described::<KindChoice>(), described::<DeviceKind>());
    assert_eq!(KindChoice::value_variants().len(), DeviceKind::ALL.len());
    for (c, k) in KindChoice::value_variants().iter().zip(DeviceKind::ALL) {
        assert_eq!(c.wire, convert::kind(k), "{k:?}");
    }
}

#[test]
fn verdicts_are_the_agents_verdicts() {
    assert_eq!(described::<VerdictChoice>(), described::<Verdict>());
    for (c, v) in VerdictChoice::value_variants().iter().zip(Verdict::value_variants()) {
        assert_eq!(c.wire, convert::verdict(*v), "{v:?}");
    }
}
