//! The keys a device's volume is known by, shared by the index (its lookups) and the sweep (one
//! part per volume): an rbd image as `pool[/namespace]/image` (a snapshot as `IMAGE@SNAP`), a
//! SCSI or multipath disk by its WWID, an nbd device by its backend.

use blockjanitor_proto::v1 as pb;

/// `pool/image` or `pool/namespace/image`.
pub fn image_key(pool: &str, namespace: &str, image: &str) -> String {
    if namespace.is_empty() {
        format!("{pool}/{image}")
    } else {
        format!("{pool}/{namespace}/{image}")
    }
}

/// The volume a device is a view of (`None`: not a volume, such as a loop device).
pub fn volume_of(d: &pb::Device) -> Option<(String, bool)> {
    if let Some(r) = &d.rbd {
        let image = image_key(&r.pool, &r.pool_namespace, &r.image);
        let snap = !(r.snap.is_empty() || r.snap == "-");
        return Some(if snap { (format!("{image}@{}", r.snap), true) } else { (image, false) });
    }
    if !d.wwid.is_empty() {
        return Some((d.wwid.to_ascii_lowercase(), false));
    }
    (!d.nbd_backend.is_empty()).then(|| (d.nbd_backend.clone(), false))
}
