//! What both CLIs show: one output model and one renderer for `blockjanitor-agent` (its
//! one-shot commands) and `agentctl`.
//!
//! The model is the gRPC messages (`blockjanitor_proto::v1`): the agent converts the engine's
//! results to them with the conversion its gRPC server uses, so a one-shot answer and a daemon's
//! answer are the same messages, rendered here the same way. It lives in blockjanitor-rpc, not in
//! a crate of its own, because both binaries (and the console) already depend on this crate and on
//! nothing else in common; a new crate would need the image build, the CI lists and the fuzz
//! workspace to learn a new directory for about 1,000 lines that depend only on the wire types.
//!
//! [`doc`] wraps every JSON/YAML document in its envelope (`schema_version`, `document`; the
//! schema is docs/schema/blockjanitor-v1.schema.json, described in docs/schema/README.md);
//! [`values`] turns messages into those documents' JSON values; [`names`] turns enum values
//! into lower-case names; [`scan`] renders a scan as one lsblk-shaped table (its [`columns`],
//! drawn flat or as a [`tree`], coloured and fitted to what [`term`] allows); [`text`], [`plan`]
//! and [`apply`] render the other messages as text (with [`table`] and [`time`]; [`fold`] says a
//! repeated line once, with a count), [`orphans`] the orphaned pod volume directories `scan` lists;
//! [`holders`] renders the `holders` command (fuser-style, or one line per hold with `-v`);
//! [`exit`] is the one table of exit codes (held / free / unknown / refused / error) both CLIs
//! exit with; [`format`] writes a value as JSON or YAML; [`explain`] renders the console's
//! `explain` (its `explanation` document and table); [`choices`] is what `--kind` and
//! `--verdict` take, and the filter both CLIs' `scan` apply.

pub mod apply;
pub mod choices;
pub mod columns;
pub mod doc;
pub mod exit;
pub mod explain;
pub mod fold;
pub mod format;
pub mod holders;
pub mod names;
pub mod orphans;
pub mod pins;
pub mod plan;
pub mod scan;
pub mod table;
pub mod term;
pub mod text;
pub mod time;
pub mod tree;
pub mod values;
