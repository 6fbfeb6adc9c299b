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
//! into lower-case names; [`text`], [`plan`] and [`apply`] render the same messages as tables
//! (with [`table`] and [`time`]); [`exit`] is the one table of exit codes (held / free / unknown
//! / refused / error) both CLIs exit with; [`format`] writes a value as JSON or YAML.

pub mod apply;
pub mod doc;
pub mod exit;
pub mod format;
pub mod names;
pub mod plan;
pub mod table;
pub mod text;
pub mod time;
pub mod values;
