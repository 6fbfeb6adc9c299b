//! Unit tests of the identifier parsers (console/src/ident.rs), over forms as the tools print
//! them: `rbd showmapped`, ceph-csi's PV attributes, `multipath -ll`, sysfs `device/wwid`,
//! `/dev/disk/by-id`, `iscsiadm -m session`, `nvme list-subsys`.

use super::*;

#[test]
fn image_specs_with_and_without_a_rados_namespace() {
    for (text, pool, ns, image) in [
        (
            "k8s/csi-vol-1f0c7a4e-5b2d-11ee-9c1b-0a580a8100a6",
            "k8s",
            "",
            "csi-vol-1f0c7a4e-5b2d-11ee-9c1b-0a580a8100a6",
        ),
        ("replicapool/tenants/csi-vol-10ff5cc1", "replicapool", "tenants", "csi-vol-10ff5cc1"),
        ("rbd:mec-ecs-pool/kubernetes-dynamic-pvc-0a5e", "mec-ecs-pool", "", "kubernetes-dynamic-pvc-0a5e"),
        ("  rbd/img.v2_final  ", "rbd", "", "img.v2_final"),
    ] {
        let spec = parse_image(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((spec.pool.as_str(), spec.namespace.as_str(), spec.image.as_str()), (pool, ns, image));
    }
    assert_eq!(parse_image("p/ns/i").expect("ok").key(), "p/ns/i");
    assert_eq!(parse_image("p/i").expect("ok").key(), "p/i");
}

#[test]
fn image_specs_that_are_not_are_errors_naming_what_was_expected() {
    for bad in ["", "img", "k8s/", "/img", "k8s//img", "a/b/c/d", "k8s/my image", "k8s/im\tg", "k8s/im\u{7}g"]
    {
        let e = parse_image(bad).expect_err(bad).to_string();
        assert!(e.contains("expected pool/image or pool/namespace/image"), "{bad}: {e}");
    }
    let e = parse_image("k8s/db@daily-2026-11-27").expect_err("snapshot");
    assert_eq!(e, IdentError::Snapshot("k8s/db@daily-2026-11-27".into(), "daily-2026-11-27".into()));
    assert!(e.to_string().contains("without @daily-2026-11-27"), "{e}");
    assert!(parse_image("k8s/ns/db@").is_err());
}

#[test]
fn wwids_in_every_form_the_tools_print() {
    // multipath -ll (NAA 6), its sysfs device/wwid, and the udev by-id link: the same LUN.
    let want =
        vec!["3600a0b80005b10ca0000b1d44d3fd8d1".to_owned(), "naa.600a0b80005b10ca0000b1d44d3fd8d1".into()];
    assert_eq!(parse_wwid("3600A0B80005B10CA0000B1D44D3FD8D1").expect("multipath"), want);
    assert_eq!(parse_wwid("naa.600a0b80005b10ca0000b1d44d3fd8d1").expect("sysfs"), want);
    assert_eq!(parse_wwid("wwn-0x600a0b80005b10ca0000b1d44d3fd8d1").expect("by-id"), want);
    // Incident 3's map, NAA 5 (16 digits), EUI-64.
    assert!(parse_wwid("3618cf24100f8f457014a764c000001f6").is_ok());
    assert_eq!(parse_wwid("35000c500a1b2c3d4").expect("naa5")[1], "naa.5000c500a1b2c3d4");
    assert_eq!(parse_wwid("eui.0025388b91b2c3d4").expect("eui")[0], "20025388b91b2c3d4");
    assert!(parse_wwid("t10.ATA     QEMU HARDDISK                           QM00005").is_ok());
    assert!(parse_wwid("1ATA     ST3500418AS                                     9VMH0WRQ").is_ok());
    assert!(parse_wwid("8iqn.2004-10.com.example:disk1").is_ok());
    for bad in [
        "",
        "3600a0b8",
        "3600a0b8zz05b10ca0000b1d44d3fd8d1",
        "naa.600a",
        "wwn-0xnothex",
        "eui.12",
        "t10.",
        "hello",
        "1abc",
        "8x",
    ] {
        let e = parse_wwid(bad).expect_err(bad).to_string();
        assert!(e.contains("expected 3600a0b8000"), "{bad}: {e}");
    }
}

#[test]
fn iscsi_and_nvme_names() {
    for ok in [
        "iqn.2004-10.com.example:disk1",
        "iqn.2003-01.org.linux-iscsi.node1.x8664:sn.7f3a9c1d2e4b",
        "IQN.1994-05.com.redhat:8f3e9c1d2e4b",
        "eui.02004567A425678D",
        "naa.52004567BA64678D",
    ] {
        assert!(parse_iqn(ok).is_ok(), "{ok}");
    }
    assert_eq!(parse_iqn("IQN.1994-05.com.redhat:ab").expect("ok"), "iqn.1994-05.com.redhat:ab");
    for bad in [
        "iqn.2004.com.example",
        "iqn.2004-13.com.example:x",
        "iqn.2004-10.:x",
        "iqn.2004-10.com..x",
        "eui.123",
        "target1",
        "iqn.2004-10.com.example:a b",
    ] {
        let e = parse_iqn(bad).expect_err(bad).to_string();
        assert!(e.contains("expected iqn.YYYY-MM.reversed.domain"), "{bad}: {e}");
    }
    for ok in [
        "nqn.2014-08.org.nvmexpress:uuid:1B4E28BA-2FA1-11D2-883F-0016D3CCA427",
        "nqn.2014-08.org.nvmexpress.discovery",
        "nqn.2019-08.org.qemu:nvme-tcp-target",
        "nqn.1992-08.com.netapp:sn.a0b1c2d3e4f5:subsystem.k8s_pool",
    ] {
        assert!(parse_nqn(ok).is_ok(), "{ok}");
    }
    assert!(parse_nqn("nqn.2014-08.org.nvmexpress:uuid:1B4E28BA-2FA1-11D2-883F-0016D3CCA427")
        .expect("ok")
        .ends_with("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
    for bad in [
        "nqn.2014-08.org.nvmexpress:uuid:xyz",
        "nqn.2019-08.org.qemu",
        "nqn.19-08.org.qemu:x",
        "iqn.2019-08.org.qemu:x",
    ] {
        let e = parse_nqn(bad).expect_err(bad).to_string();
        assert!(e.contains("expected nqn."), "{bad}: {e}");
    }
}

#[test]
fn a_bare_query_is_taken_by_its_form_or_refused_with_every_form() {
    assert!(matches!(parse_bare("3618cf24100f8f457014a764c000001f6"), Ok(Bare::Wwid(_))));
    assert!(matches!(parse_bare("iqn.2004-10.com.example:disk1"), Ok(Bare::Iqn(_))));
    assert!(matches!(parse_bare("nqn.2019-08.org.qemu:nvme-tcp-target"), Ok(Bare::Nqn(_))));
    let e = parse_bare("pvc-0a5eb91b").expect_err("a PV name nobody knows").to_string();
    assert!(e.starts_with("'pvc-0a5eb91b' is not understood: expected an rbd image"), "{e}");
    let e = parse_bare("naa.60").expect_err("a short NAA").to_string();
    assert!(e.contains("is not a WWID"), "{e}");
    let e = parse_bare("iqn.x").expect_err("a bad IQN").to_string();
    assert!(e.contains("is not an iSCSI name"), "{e}");
    assert!(parse_bare("").is_err());
    // Not ASCII where a type digit or a date is expected: an error, never a panic.
    for odd in ["é3600a0b8", "3é", "iqn.20é4-10.com.x:y", "nqn.2014-0é.org:x", "naa.é"] {
        assert!(parse_bare(odd).is_err(), "{odd}");
    }
}
