//! The device-mapper control ioctls, on `/dev/mapper/control` (`<linux/dm-ioctl.h>`). Read-only,
//! for the scanner: `DM_LIST_DEVICES`, `DM_DEV_STATUS` and `DM_TABLE_STATUS` (status lines, or
//! table lines with `DM_STATUS_TABLE_FLAG`). Writing, for `act/` only: `DM_TARGET_MSG`
//! (e.g. `fail_if_no_path`) and `DM_DEV_REMOVE` (optionally deferred).
//!
//! Every call passes one buffer: a 312-byte `struct dm_ioctl` header followed by room for the
//! kernel's reply. Requests are written and replies read field by field at the header's fixed
//! offsets, so the only `unsafe` is the `ioctl(2)` call itself and every reply is checked
//! against the buffer's bounds before it is believed. None of these calls does I/O to a mapped
//! device (`DM_NOFLUSH_FLAG` is set so no target flushes to answer a status query).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::model::DevNum;

/// `sizeof(struct dm_ioctl)`.
pub(crate) const HEADER_LEN: usize = 312;
/// `sizeof(struct dm_target_spec)`.
const SPEC_LEN: usize = 40;
/// Offset of `name` in `struct dm_name_list`.
const NAME_LIST_NAME: usize = 12;
const NAME_LEN: usize = 128;
const UUID_LEN: usize = 129;

// Header field offsets.
const OFF_DATA_SIZE: usize = 12;
const OFF_DATA_START: usize = 16;
const OFF_TARGET_COUNT: usize = 20;
const OFF_OPEN_COUNT: usize = 24;
const OFF_FLAGS: usize = 28;
const OFF_EVENT_NR: usize = 32;
const OFF_DEV: usize = 40;
const OFF_NAME: usize = 48;
const OFF_UUID: usize = OFF_NAME + NAME_LEN;

/// `_IOWR(0xfd, cmd, struct dm_ioctl)`.
const fn iowr(cmd: u32) -> u32 {
    (3 << 30) | ((HEADER_LEN as u32) << 16) | (0xfd << 8) | cmd
}
const DM_LIST_DEVICES: u32 = iowr(2);
const DM_DEV_STATUS: u32 = iowr(7);
const DM_TABLE_STATUS: u32 = iowr(12);
const DM_DEV_REMOVE: u32 = iowr(4);
const DM_TARGET_MSG: u32 = iowr(14);
/// Remove the device once its last opener closes it (only on request).
const DM_DEFERRED_REMOVE: u32 = 1 << 17;

pub(crate) const DM_READONLY_FLAG: u32 = 1 << 0;
pub(crate) const DM_SUSPEND_FLAG: u32 = 1 << 1;
const DM_STATUS_TABLE_FLAG: u32 = 1 << 4;
const DM_BUFFER_FULL_FLAG: u32 = 1 << 8;
const DM_NOFLUSH_FLAG: u32 = 1 << 11;

/// Interface version we speak: 4.x; any 4.x kernel accepts minor 0.
const VERSION: [u32; 3] = [4, 0, 0];
const FIRST_BUFFER: usize = 16 * 1024;
const MAX_BUFFER: usize = 32 * 1024 * 1024;

/// The fields of a reply's `struct dm_ioctl` the scanner uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub target_count: u32,
    pub open_count: i32,
    pub flags: u32,
    pub event_nr: u32,
    pub dev: DevNum,
    pub name: String,
    pub uuid: String,
}

/// One target of a `DM_TABLE_STATUS` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TargetSpec {
    pub start: u64,
    pub length: u64,
    pub target_type: String,
    pub params: String,
}

/// Which mapped device a per-device command is for. The kernel looks a device up by uuid when
/// one is given (name and number must then be empty), else by number. Numbers (dm minors) are
/// reused the moment a device is removed; a uuid names one device for as long as it lives, so
/// every command that changes a device addresses it by uuid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DmRef<'a> {
    Dev(DevNum),
    Uuid(&'a str),
}

impl From<DevNum> for DmRef<'_> {
    fn from(d: DevNum) -> Self {
        DmRef::Dev(d)
    }
}

/// An open `/dev/mapper/control`.
pub(crate) struct Control {
    file: File,
}

impl Control {
    /// Opens the control node; refuses anything that is not a character device (a fixture tree's
    /// placeholder file must not receive ioctls).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::options().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path)?;
        if !file.metadata()?.file_type().is_char_device() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a character device"));
        }
        Ok(Self { file })
    }

    /// `DM_LIST_DEVICES`: the name and device number of every mapped device.
    pub fn list_devices(&self) -> io::Result<Vec<(String, DevNum)>> {
        let (_, data) = self.call(DM_LIST_DEVICES, None, 0)?;
        parse_name_list(&data)
    }

    /// `DM_DEV_STATUS` of one device.
    pub fn dev_status<'a>(&self, dev: impl Into<DmRef<'a>>) -> io::Result<Header> {
        self.call(DM_DEV_STATUS, Some(dev.into()), 0).map(|(h, _)| h)
    }

    /// `DM_TABLE_STATUS` of the live table: status lines, or table lines when `table` is set.
    pub fn table_status<'a>(
        &self,
        dev: impl Into<DmRef<'a>>,
        table: bool,
    ) -> io::Result<(Header, Vec<TargetSpec>)> {
        let flags = DM_NOFLUSH_FLAG | if table { DM_STATUS_TABLE_FLAG } else { 0 };
        let (header, data) = self.call(DM_TABLE_STATUS, Some(dev.into()), flags)?;
        let specs = parse_targets(&data, header.target_count)?;
        Ok((header, specs))
    }

    /// `DM_TARGET_MSG`: sends `message` to the target at `sector` of the device (for multipath:
    /// `fail_if_no_path`, `fail_path 8:16`). Changes the device: for `act/` only.
    pub fn message(&self, dev: DmRef<'_>, sector: u64, message: &str) -> io::Result<()> {
        let mut payload = sector.to_ne_bytes().to_vec();
        payload.extend_from_slice(message.as_bytes());
        payload.push(0);
        self.call_with(DM_TARGET_MSG, Some(dev), 0, &payload).map(|_| ())
    }

    /// `DM_DEV_REMOVE`: removes the device (EBUSY while it is open, unless `deferred`, which
    /// removes it on last close). Changes the device: for `act/` only.
    pub fn remove(&self, dev: DmRef<'_>, deferred: bool) -> io::Result<()> {
        let flags = if deferred { DM_DEFERRED_REMOVE } else { 0 };
        self.call(DM_DEV_REMOVE, Some(dev), flags).map(|_| ())
    }

    /// Runs one command, growing the buffer while the kernel says it was too small. Returns the
    /// reply header and the data area (`data_start..data_size`).
    fn call(&self, request: u32, dev: Option<DmRef<'_>>, flags: u32) -> io::Result<(Header, Vec<u8>)> {
        self.call_with(request, dev, flags, &[])
    }

    /// [`Control::call`] with a request payload placed after the header.
    fn call_with(
        &self,
        request: u32,
        dev: Option<DmRef<'_>>,
        flags: u32,
        payload: &[u8],
    ) -> io::Result<(Header, Vec<u8>)> {
        let mut size = FIRST_BUFFER.max(HEADER_LEN + payload.len() + 8);
        loop {
            let mut buf = request_buffer(size, dev, flags)?;
            buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
            // SAFETY: `buf` is a live, writable allocation of `size` bytes that starts with a
            // `struct dm_ioctl` whose `data_size` is `size`; the kernel reads and writes at most
            // `data_size` bytes through the pointer, and the fd stays open for the call.
            let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, buf.as_mut_ptr()) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            let header = parse_header(&buf)?;
            if header.flags & DM_BUFFER_FULL_FLAG != 0 {
                if size >= MAX_BUFFER {
                    return Err(bad(format!("reply larger than {MAX_BUFFER} bytes")));
                }
                size *= 2;
                continue;
            }
            let data = data_area(&buf)?.to_vec();
            return Ok((header, data));
        }
    }
}

/// A zeroed request: version, sizes, flags and (for per-device commands) either the device
/// number or the uuid; the name stays empty.
pub(crate) fn request_buffer(size: usize, dev: Option<DmRef<'_>>, flags: u32) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size.max(HEADER_LEN)];
    for (i, v) in VERSION.iter().enumerate() {
        put_u32(&mut buf, i * 4, *v);
    }
    let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    put_u32(&mut buf, OFF_DATA_SIZE, len);
    put_u32(&mut buf, OFF_DATA_START, HEADER_LEN as u32);
    put_u32(&mut buf, OFF_FLAGS, flags);
    match dev {
        Some(DmRef::Dev(d)) => {
            buf[OFF_DEV..OFF_DEV + 8].copy_from_slice(&libc::makedev(d.major, d.minor).to_ne_bytes())
        }
        Some(DmRef::Uuid(u)) => {
            if u.is_empty() || u.len() >= UUID_LEN || u.as_bytes().contains(&0) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("'{}' cannot be a device-mapper uuid", u.chars().take(64).collect::<String>()),
                ));
            }
            buf[OFF_UUID..OFF_UUID + u.len()].copy_from_slice(u.as_bytes());
        }
        None => {}
    }
    Ok(buf)
}

fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed device-mapper reply: {}", msg.into()))
}

fn u32_at(b: &[u8], off: usize) -> io::Result<u32> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| bad(format!("no u32 at offset {off}")))
}

fn u64_at(b: &[u8], off: usize) -> io::Result<u64> {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_ne_bytes)
        .ok_or_else(|| bad(format!("no u64 at offset {off}")))
}

/// A NUL-terminated string inside `b[off..off + max]`.
fn cstr_at(b: &[u8], off: usize, max: usize, what: &str) -> io::Result<String> {
    let field = b.get(off..b.len().min(off + max)).ok_or_else(|| bad(format!("no {what} at {off}")))?;
    let end = field.iter().position(|&c| c == 0).ok_or_else(|| bad(format!("{what} not terminated")))?;
    std::str::from_utf8(&field[..end]).map(str::to_owned).map_err(|_| bad(format!("{what} is not UTF-8")))
}

/// Reads the reply header.
pub(crate) fn parse_header(buf: &[u8]) -> io::Result<Header> {
    if buf.len() < HEADER_LEN {
        return Err(bad(format!("{} bytes, shorter than the header", buf.len())));
    }
    Ok(Header {
        target_count: u32_at(buf, OFF_TARGET_COUNT)?,
        open_count: u32_at(buf, OFF_OPEN_COUNT)? as i32,
        flags: u32_at(buf, OFF_FLAGS)?,
        event_nr: u32_at(buf, OFF_EVENT_NR)?,
        dev: DevNum::from_dev_t(u64_at(buf, OFF_DEV)?),
        name: cstr_at(buf, OFF_NAME, NAME_LEN, "name")?,
        uuid: cstr_at(buf, OFF_UUID, UUID_LEN, "uuid")?,
    })
}

/// The reply's data area, checked against the buffer.
pub(crate) fn data_area(buf: &[u8]) -> io::Result<&[u8]> {
    let start = u32_at(buf, OFF_DATA_START)? as usize;
    let end = u32_at(buf, OFF_DATA_SIZE)? as usize;
    if start < HEADER_LEN || end > buf.len() {
        return Err(bad(format!("data {start}..{end} outside the {}-byte buffer", buf.len())));
    }
    Ok(buf.get(start..end.max(start)).unwrap_or_default())
}

/// Parses a `DM_LIST_DEVICES` data area: `struct dm_name_list` records chained by `next`
/// (offset from the record's own start; 0 ends the list). A first record with `dev == 0`
/// means no devices.
pub(crate) fn parse_name_list(data: &[u8]) -> io::Result<Vec<(String, DevNum)>> {
    let mut out = Vec::new();
    if data.len() < 8 || u64_at(data, 0)? == 0 {
        return Ok(out);
    }
    let mut off = 0usize;
    loop {
        let dev = u64_at(data, off)?;
        let next = u32_at(data, off + 8)? as usize;
        let name = cstr_at(data, off + NAME_LIST_NAME, NAME_LEN, "device name")?;
        out.push((name, DevNum::from_dev_t(dev)));
        if next == 0 {
            return Ok(out);
        }
        if next < NAME_LIST_NAME + 1 || off + next >= data.len() {
            return Err(bad(format!("name list record at {off} points to {}", off + next)));
        }
        off += next;
    }
}

/// Parses a `DM_TABLE_STATUS` data area: `count` `struct dm_target_spec`, each followed by its
/// NUL-terminated parameter string; `next` is the offset of the following spec from the start
/// of the data area.
pub(crate) fn parse_targets(data: &[u8], count: u32) -> io::Result<Vec<TargetSpec>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    for i in 0..count {
        if off + SPEC_LEN > data.len() {
            return Err(bad(format!("target {i} at {off} runs past {} bytes of data", data.len())));
        }
        let start = u64_at(data, off)?;
        let length = u64_at(data, off + 8)?;
        let next = u32_at(data, off + 20)? as usize;
        let target_type = cstr_at(data, off + 24, 16, "target type")?;
        let params = cstr_at(data, off + SPEC_LEN, data.len() - off - SPEC_LEN, "target parameters")?;
        out.push(TargetSpec { start, length, target_type, params });
        if i + 1 < count {
            if next <= off {
                return Err(bad(format!("target {i} at {off} points back to {next}")));
            }
            off = next;
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn align8(v: &mut Vec<u8>) {
        while !v.len().is_multiple_of(8) {
            v.push(0);
        }
    }

    /// A reply laid out the way the kernel writes it (dm-ioctl.c), for the parsers.
    pub(crate) fn reply(header: &Header, data: &[u8]) -> Vec<u8> {
        let mut buf = request_buffer(HEADER_LEN, Some(DmRef::Dev(header.dev)), header.flags).expect("buffer");
        put_u32(&mut buf, OFF_TARGET_COUNT, header.target_count);
        put_u32(&mut buf, OFF_OPEN_COUNT, header.open_count as u32);
        put_u32(&mut buf, OFF_EVENT_NR, header.event_nr);
        buf[OFF_NAME..OFF_NAME + header.name.len()].copy_from_slice(header.name.as_bytes());
        buf[OFF_UUID..OFF_UUID + header.uuid.len()].copy_from_slice(header.uuid.as_bytes());
        buf.extend_from_slice(data);
        let len = buf.len() as u32;
        put_u32(&mut buf, OFF_DATA_SIZE, len);
        buf
    }

    /// A `DM_TABLE_STATUS` data area.
    pub(crate) fn targets_data(specs: &[TargetSpec]) -> Vec<u8> {
        let mut out = Vec::new();
        for s in specs {
            let at = out.len();
            out.extend_from_slice(&s.start.to_ne_bytes());
            out.extend_from_slice(&s.length.to_ne_bytes());
            out.extend_from_slice(&0u32.to_ne_bytes());
            out.extend_from_slice(&0u32.to_ne_bytes());
            let mut ty = [0u8; 16];
            ty[..s.target_type.len()].copy_from_slice(s.target_type.as_bytes());
            out.extend_from_slice(&ty);
            out.extend_from_slice(s.params.as_bytes());
            out.push(0);
            align8(&mut out);
            let next = out.len() as u32;
            out[at + 20..at + 24].copy_from_slice(&next.to_ne_bytes());
        }
        out
    }

    /// A `DM_LIST_DEVICES` data area, with the event number and flags that kernels since 4.45
    /// put after each name (the parser must skip them through `next`).
    fn name_list(devs: &[(&str, DevNum)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev: Option<usize> = None;
        for (name, d) in devs {
            let at = out.len();
            if let Some(p) = prev {
                let next = (at - p) as u32;
                out[p + 8..p + 12].copy_from_slice(&next.to_ne_bytes());
            }
            out.extend_from_slice(&libc::makedev(d.major, d.minor).to_ne_bytes());
            out.extend_from_slice(&0u32.to_ne_bytes());
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            align8(&mut out);
            out.extend_from_slice(&7u32.to_ne_bytes()); // event_nr
            out.extend_from_slice(&0u32.to_ne_bytes()); // flags
            align8(&mut out);
            prev = Some(at);
        }
        if out.is_empty() {
            out.extend_from_slice(&0u64.to_ne_bytes());
        }
        out
    }

    #[test]
    fn ioctl_numbers_match_the_header() {
        // Printed by a C program including <linux/dm-ioctl.h> on x86_64.
        assert_eq!(DM_LIST_DEVICES, 0xc138_fd02);
        assert_eq!(DM_DEV_STATUS, 0xc138_fd07);
        assert_eq!(DM_TABLE_STATUS, 0xc138_fd0c);
        assert_eq!(OFF_UUID, 176);
    }

    #[test]
    fn request_layout() {
        let b = request_buffer(4096, Some(DmRef::Dev(DevNum::new(253, 12))), DM_STATUS_TABLE_FLAG)
            .expect("buffer");
        assert_eq!(b.len(), 4096);
        assert_eq!(u32_at(&b, 0).ok(), Some(4));
        assert_eq!(u32_at(&b, OFF_DATA_SIZE).ok(), Some(4096));
        assert_eq!(u32_at(&b, OFF_DATA_START).ok(), Some(312));
        assert_eq!(u32_at(&b, OFF_FLAGS).ok(), Some(DM_STATUS_TABLE_FLAG));
        assert_eq!(u64_at(&b, OFF_DEV).ok(), Some((253 << 8) | 12));
        assert!(b[OFF_NAME..HEADER_LEN].iter().all(|&c| c == 0));
        // By uuid: the number stays 0 (the kernel refuses a request naming both).
        let b = request_buffer(4096, Some(DmRef::Uuid("mpath-3600a098")), 0).expect("buffer");
        assert_eq!(u64_at(&b, OFF_DEV).ok(), Some(0));
        assert_eq!(cstr_at(&b, OFF_UUID, UUID_LEN, "uuid").ok().as_deref(), Some("mpath-3600a098"));
        assert!(b[OFF_NAME..OFF_UUID].iter().all(|&c| c == 0));
        for bad in ["", "a\0b", &"u".repeat(UUID_LEN)] {
            assert!(request_buffer(4096, Some(DmRef::Uuid(bad)), 0).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn name_lists() {
        let devs = [("mpathb", DevNum::new(253, 12)), ("mpathb1", DevNum::new(253, 300))];
        let got = parse_name_list(&name_list(&devs)).expect("parses");
        assert_eq!(got, vec![("mpathb".to_owned(), devs[0].1), ("mpathb1".to_owned(), devs[1].1)]);
        assert!(parse_name_list(&name_list(&[])).expect("empty").is_empty());
        assert!(parse_name_list(&[]).expect("no data").is_empty());
        let mut bad_next = name_list(&devs);
        bad_next[8..12].copy_from_slice(&4096u32.to_ne_bytes());
        assert!(parse_name_list(&bad_next).is_err());
        let mut unterminated = name_list(&devs[..1]);
        unterminated.truncate(NAME_LIST_NAME + 3);
        assert!(parse_name_list(&unterminated).is_err());
    }

    #[test]
    fn target_specs_and_headers() {
        let specs = vec![
            TargetSpec { start: 0, length: 2048, target_type: "linear".into(), params: "8:0 2048".into() },
            TargetSpec {
                start: 2048,
                length: 4096,
                target_type: "multipath".into(),
                params: "0 0 0 0".into(),
            },
        ];
        let header = Header {
            target_count: 2,
            open_count: 1,
            flags: DM_SUSPEND_FLAG,
            event_nr: 3,
            dev: DevNum::new(253, 0),
            name: "vg-lv".into(),
            uuid: "LVM-abc".into(),
        };
        let buf = reply(&header, &targets_data(&specs));
        assert_eq!(parse_header(&buf).expect("header"), header);
        let data = data_area(&buf).expect("data");
        assert_eq!(parse_targets(data, 2).expect("targets"), specs);
        assert!(parse_targets(&data[..50], 2).is_err(), "truncated second spec");
        assert!(parse_targets(data, 3).is_err(), "more targets than data");
        assert!(parse_header(&buf[..100]).is_err());
        let mut lying = buf.clone();
        put_u32(&mut lying, OFF_DATA_SIZE, (buf.len() + 1) as u32);
        assert!(data_area(&lying).is_err());
    }

    #[test]
    fn missing_or_fake_control_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Control::open(&dir.path().join("control")).err().expect("absent");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::fs::write(dir.path().join("control"), "").expect("write");
        let e = Control::open(&dir.path().join("control")).err().expect("regular file");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
