//! The guest and Ceph scenarios' documents against the v1 schema file: every `-o json` section
//! a scenario printed (`Run::documents`) must match `docs/schema/blockjanitor-v1.schema.json`.
//! These are the documents the host cannot make: multipath maps, SCSI disks, iSCSI sessions,
//! NVMe controllers, nbd and rbd devices, btrfs holders, from Debian's kernel in the guest.

use blockjanitor_tests::guest::Run;

use crate::schema::Schema;

/// Checks every document `run` printed against the schema; panics naming the section.
pub fn schema_valid(run: &Run) {
    let schema = Schema::load();
    for (name, doc) in run.documents() {
        let document = doc["document"].as_str().unwrap_or("(not a string)").to_owned();
        schema.check(&doc, &document, &format!("section {name}"));
    }
}
