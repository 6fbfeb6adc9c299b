//! Parsing the storage identifiers a user pastes into Where (besides Ceph watcher addresses,
//! [`crate::ceph_addr`]): rbd image specs with or without a rados namespace, WWIDs in the forms
//! multipath, sysfs and udev print them, iSCSI names (IQN, EUI, NAA) and NVMe qualified names.
//! Each parser accepts only its forms and otherwise says what it expected, with examples: a
//! query that was not understood must never be answered as if it had been (an empty answer reads
//! as "nowhere"). Pure: text in, no I/O.

/// What Where takes, with examples (ends the error for a query that is none of them).
pub const EXPECTED: &str = "expected an rbd image (pool/image or pool/namespace/image), a PVC \
     (namespace/name or pvc/namespace/name), a PV (pv/NAME or a known PV name), a WWID (3600a0b8000..., \
     naa.600a0b8..., eui.0025388..., wwn-0x600a0b8...), an iSCSI target (iqn.2004-10.com.example:disk1) \
     or an NVMe subsystem (nqn.2014-08.org.nvmexpress:uuid:...)";

/// Why an identifier was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentError {
    #[error("'{0}' is not an rbd image spec: {1}; expected pool/image or pool/namespace/image (e.g. k8s/csi-vol-1f0c or k8s/tenants/csi-vol-1f0c)")]
    Image(String, &'static str),
    #[error("'{0}' names a snapshot: Where finds mappings of images, give pool/image or pool/namespace/image without @{1} (a mapped snapshot is listed with its image)")]
    Snapshot(String, String),
    #[error("'{0}' is not a WWID: {1}; expected 3600a0b8000..., 2002538..., naa.600a0b8..., eui.0025388..., t10.ATA..., or wwn-0x600a0b8...")]
    Wwid(String, &'static str),
    #[error("'{0}' is not an iSCSI name: {1}; expected iqn.YYYY-MM.reversed.domain[:name] (iqn.2004-10.com.example:disk1), eui.<16 hex> or naa.<16 or 32 hex>")]
    Iqn(String, &'static str),
    #[error("'{0}' is not an NVMe qualified name: {1}; expected nqn.YYYY-MM.reversed.domain:name or nqn.2014-08.org.nvmexpress:uuid:<uuid>")]
    Nqn(String, &'static str),
    #[error("'{0}' is not understood: {EXPECTED}")]
    Unknown(String),
}

/// An rbd image: `pool/image` or `pool/namespace/image`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    pub pool: String,
    /// The rados namespace ("" for the default).
    pub namespace: String,
    pub image: String,
}

impl ImageSpec {
    /// The index's key: `pool/image` or `pool/namespace/image`.
    pub fn key(&self) -> String {
        crate::index::image_key(&self.pool, &self.namespace, &self.image)
    }
}

fn printable(s: &str) -> bool {
    s.chars().all(|c| !c.is_control() && !c.is_whitespace())
}

/// An rbd image spec. `rbd:` (as qemu and rbd-nbd take it) is accepted in front; a snapshot
/// (`@snap`) is an error saying to give the image.
pub fn parse_image(s: &str) -> Result<ImageSpec, IdentError> {
    let t = s.trim();
    let err = |why| IdentError::Image(t.to_owned(), why);
    let spec = t.strip_prefix("rbd:").unwrap_or(t);
    if spec.is_empty() {
        return Err(err("it is empty"));
    }
    if !printable(spec) {
        return Err(err("it contains white space or control characters"));
    }
    if let Some((image, snap)) = spec.split_once('@') {
        if snap.is_empty() || image.is_empty() {
            return Err(err("'@' with nothing on one side"));
        }
        return Err(IdentError::Snapshot(t.to_owned(), snap.to_owned()));
    }
    let parts: Vec<&str> = spec.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(err("a part between slashes is empty"));
    }
    match parts.as_slice() {
        [pool, image] => {
            Ok(ImageSpec { pool: (*pool).into(), namespace: String::new(), image: (*image).into() })
        }
        [pool, ns, image] => {
            Ok(ImageSpec { pool: (*pool).into(), namespace: (*ns).into(), image: (*image).into() })
        }
        [_] => Err(err("no pool (no '/')")),
        _ => Err(err("more than three parts")),
    }
}

fn hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A WWID, lower case, in every form the index may hold it: multipath's (`3<naa>`, `2<eui>`,
/// `1<t10>`, `8<name>`), sysfs `device/wwid` (`naa.`, `eui.`, `t10.`) and udev's
/// `wwn-0x<naa>`, which is looked up as multipath's `3<naa>` and sysfs's `naa.<naa>`.
pub fn parse_wwid(s: &str) -> Result<Vec<String>, IdentError> {
    let t = s.trim();
    let err = |why| IdentError::Wwid(t.to_owned(), why);
    if t.is_empty() {
        return Err(err("it is empty"));
    }
    if t.chars().any(char::is_control) {
        return Err(err("it contains control characters"));
    }
    let l = t.to_ascii_lowercase();
    if let Some(naa) = l.strip_prefix("wwn-0x").or_else(|| l.strip_prefix("naa.")) {
        if !hex(naa) || ![16, 32].contains(&naa.len()) {
            return Err(err("an NAA is 16 or 32 hex digits"));
        }
        return Ok(vec![format!("3{naa}"), format!("naa.{naa}")]);
    }
    if let Some(eui) = l.strip_prefix("eui.") {
        if !hex(eui) || ![16, 24, 32].contains(&eui.len()) {
            return Err(err("an EUI is 16, 24 or 32 hex digits"));
        }
        return Ok(vec![format!("2{eui}"), l.clone()]);
    }
    if let Some(rest) = l.strip_prefix("t10.") {
        return if rest.trim().is_empty() { Err(err("nothing after t10.")) } else { Ok(vec![l.clone()]) };
    }
    let Some(first) = l.chars().next() else { return Err(err("it is empty")) };
    let rest = &l[first.len_utf8()..];
    match first {
        '3' if hex(rest) && [16, 32].contains(&rest.len()) => Ok(vec![l.clone(), format!("naa.{rest}")]),
        '2' if hex(rest) && [16, 24, 32].contains(&rest.len()) => Ok(vec![l.clone(), format!("eui.{rest}")]),
        '3' | '2' => Err(err("after the type digit, 16 or 32 hex digits (an NAA) or 16, 24 or 32 (an EUI)")),
        // T10: an 8-character vendor id, then the product and serial.
        '1' if rest.trim().len() > 8 => Ok(vec![l.clone()]),
        // A SCSI name string: an iSCSI name.
        '8' if ["iqn.", "eui.", "naa."].iter().any(|p| rest.starts_with(p)) => Ok(vec![l.clone()]),
        _ => Err(err("it starts with neither a type digit (1, 2, 3, 8) nor naa., eui., t10. or wwn-0x")),
    }
}

/// `YYYY-MM.` then a reversed domain (`iqn.` and `nqn.` names).
fn dated_domain(rest: &str) -> Result<(), &'static str> {
    let b = rest.as_bytes();
    let date_ok = b.len() > 8
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'.'
        && (1..=12).contains(&rest[5..7].parse::<u8>().unwrap_or(0));
    if !date_ok {
        return Err("the date YYYY-MM. is missing or wrong");
    }
    let domain = rest[8..].split(':').next().unwrap_or("");
    if domain.is_empty()
        || domain.split('.').any(str::is_empty)
        || !domain.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    {
        return Err("the reversed domain name after the date is missing or not a domain");
    }
    Ok(())
}

/// An iSCSI name: `iqn.`, `eui.` or `naa.` form (RFC 3720, 3980), lower case.
pub fn parse_iqn(s: &str) -> Result<String, IdentError> {
    let t = s.trim();
    let err = |why| IdentError::Iqn(t.to_owned(), why);
    if t.len() > 223 {
        return Err(err("longer than 223 bytes"));
    }
    if !printable(t) {
        return Err(err("it contains white space or control characters"));
    }
    let l = t.to_ascii_lowercase();
    if let Some(rest) = l.strip_prefix("iqn.") {
        dated_domain(rest).map_err(err)?;
        return Ok(l);
    }
    if let Some(h) = l.strip_prefix("eui.") {
        return if hex(h) && h.len() == 16 { Ok(l) } else { Err(err("an eui. name is 16 hex digits")) };
    }
    if let Some(h) = l.strip_prefix("naa.") {
        return if hex(h) && [16, 32].contains(&h.len()) {
            Ok(l)
        } else {
            Err(err("an naa. name is 16 or 32 hex digits"))
        };
    }
    Err(err("it starts with none of iqn., eui., naa."))
}

/// An NVMe qualified name (`nqn.`), as the subsystem reports it (case kept: NQNs are compared
/// as given, with a uuid form's hex in lower case).
pub fn parse_nqn(s: &str) -> Result<String, IdentError> {
    let t = s.trim();
    let err = |why| IdentError::Nqn(t.to_owned(), why);
    if t.len() > 223 {
        return Err(err("longer than 223 bytes"));
    }
    if !printable(t) {
        return Err(err("it contains white space or control characters"));
    }
    let Some(rest) = t.strip_prefix("nqn.") else { return Err(err("it does not start with nqn.")) };
    if let Some(uuid) = rest.strip_prefix("2014-08.org.nvmexpress:uuid:") {
        let groups: Vec<&str> = uuid.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lens != [8, 4, 4, 4, 12] || !groups.iter().all(|g| hex(g)) {
            return Err(err("the uuid is not 8-4-4-4-12 hex digits"));
        }
        return Ok(format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid.to_ascii_lowercase()));
    }
    if rest == "2014-08.org.nvmexpress.discovery" {
        return Ok(t.to_owned());
    }
    dated_domain(rest).map_err(err)?;
    if !rest.contains(':') {
        return Err(err("no ':' and name after the domain"));
    }
    Ok(t.to_owned())
}

/// What a bare Where query (no `/`, not a known PV or nbd backend) is: a WWID, an IQN or an NQN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bare {
    /// Every form of the WWID to look up.
    Wwid(Vec<String>),
    Iqn(String),
    Nqn(String),
}

/// A bare query by its form: `nqn.` is an NQN, `iqn.` an IQN, anything else a WWID; each fails
/// with its own expectation, and a query that starts like none of them with [`EXPECTED`].
pub fn parse_bare(s: &str) -> Result<Bare, IdentError> {
    let l = s.trim().to_ascii_lowercase();
    if l.starts_with("nqn.") {
        return parse_nqn(s).map(Bare::Nqn);
    }
    if l.starts_with("iqn.") {
        return parse_iqn(s).map(Bare::Iqn);
    }
    match parse_wwid(s) {
        Ok(w) => Ok(Bare::Wwid(w)),
        // A WWID prefix that went wrong: say what a WWID is. Anything else: every form.
        Err(e) if ["naa.", "eui.", "t10.", "wwn-0x"].iter().any(|p| l.starts_with(p)) => Err(e),
        Err(e) if l.starts_with(['2', '3']) && l.len() > 16 && hex(&l) => Err(e),
        Err(_) => Err(IdentError::Unknown(s.trim().to_owned())),
    }
}

#[cfg(test)]
#[path = "ident_tests.rs"]
mod tests;
