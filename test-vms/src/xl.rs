//! What the testbed tells `xl` and reads back from dom0 and domU tools: domU
//! configurations, and parsers for `xl list`, `lspci -n` and busybox's `ping`.

use crate::domus;

/// The stand-in GPU (QEMU's e1000) as `lspci -n` shows it.
pub const STANDIN_ID: &str = "8086:100e";

/// One row of `xl list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub id: u32,
    pub memory_mib: u32,
}

pub fn parse_xl_list(text: &str) -> Vec<Domain> {
    text.lines()
        .skip_while(|l| !l.starts_with("Name"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Domain {
                name: f.first()?.to_string(),
                id: f.get(1)?.parse().ok()?,
                memory_mib: f.get(2)?.parse().ok()?,
            })
        })
        .collect()
}

pub fn find_domain<'a>(list: &'a [Domain], name: &str) -> Option<&'a Domain> {
    list.iter().find(|d| d.name == name)
}

/// `lspci -n` lines of the form `SLOT CLASS: VENDOR:DEVICE ...` → (slot, vendor:device).
pub fn parse_lspci(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(2)?.to_string()))
        })
        .collect()
}

/// The slot at which `lspci -n` shows the stand-in, if it does.
pub fn standin_slot(lspci: &str) -> Option<String> {
    parse_lspci(lspci)
        .into_iter()
        .find(|(_, id)| id == STANDIN_ID)
        .map(|(slot, _)| slot)
}

/// The "N packets received" figure of busybox ping's summary.
pub fn parse_ping_received(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.contains("packets transmitted"))?;
    let field = line.split(',').find(|f| f.contains("received"))?;
    field.split_whitespace().next()?.parse().ok()
}

/// Kernel parameters that skip the AGP aperture scan and the early PCI quirks: each
/// probes PCI configuration space through emulated port I/O, which cost an HVM guest
/// 9 s of boot under software emulation.
pub const FAST_BOOT: &str = "iommu=noaperture pci=noearly";

/// The kernel's address-space randomisation off: nothing in the testbed needs it, and
/// fixed addresses make the guest RIP that Xen prints for a crashed domU readable
/// against another guest's /proc/kallsyms (Debian ships no System.map).
pub const NO_KASLR: &str = "nokaslr";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainKind {
    /// Paravirtualised: the proxy domain (PV domains cannot live-migrate on Debian's
    /// Xen, which lacks shadow paging).
    Pv,
    /// Hardware-virtualised: the GPU guest (PCI passthrough through QEMU, live
    /// migration with HAP).
    Hvm,
}

/// A domU booting the testbed's kernel with one of its initramfs images, one network
/// interface on dom0's bridge, and the OpenCL runtime disk.
#[derive(Debug, Clone)]
pub struct DomuConfig {
    pub name: String,
    pub kind: DomainKind,
    /// `ADDR/PREFIX` on the bridge.
    pub address: String,
    pub memory_mib: u32,
    /// The initramfs, a path in dom0.
    pub ramdisk: String,
}

/// A MAC address that depends only on `seed` (Xen's OUI 00:16:3e and three bytes of
/// FNV-1a of the seed). xl gives a domain without one a random address each time it
/// is created, so a proxy domain that craned creates again would come back under a
/// new address while the guests' ARP caches and the bridges still hold the old one;
/// with a fixed one the guests reach it again at once.
pub fn stable_mac(seed: &str) -> String {
    let h = seed.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let [_, a, b, c] = h.to_be_bytes();
    // The first byte after the OUI stays below 0x80: xl's own random addresses
    // set that bit, so the two never collide.
    format!("00:16:3e:{:02x}:{b:02x}:{c:02x}", a & 0x7f)
}

impl DomuConfig {
    /// The xl configuration file. HVM domUs get no emulated NIC (`type=vif`): their
    /// network is the PV front end, as the proxy's is. The OpenCL disk is a PV disk
    /// (`xvde`: xl emulates only the first four as IDE) served by blkback through a
    /// read-only loop device (files/block-crane).
    pub fn render(&self) -> String {
        let hvm = match self.kind {
            DomainKind::Hvm => {
                "serial = \"pty\"\nvnc = 0\nsdl = 0\nvga = \"none\"\n\
                 device_model_override = \"/usr/libexec/xen-qemu-system-i386\"\n"
            }
            DomainKind::Pv => "",
        };
        let kind = match self.kind {
            DomainKind::Hvm => "hvm",
            DomainKind::Pv => "pv",
        };
        format!(
            "name = \"{name}\"\ntype = \"{kind}\"\nmemory = {memory}\nvcpus = 1\n\
             kernel = \"{kernel}\"\nramdisk = \"{ramdisk}\"\n\
             extra = \"console=hvc0 quiet {FAST_BOOT} {NO_KASLR} crane.hostname={name} crane.ip={address}\"\n\
             vif = [ \"bridge=xenbr0,type=vif,script=vif-crane,mac={mac}\" ]\n\
             disk = [ \"format=raw,vdev={vdev},access=ro,backendtype=phy,script=block-crane,target={disk}\" ]\n\
             passthrough = \"enabled\"\non_crash = \"preserve\"\n{hvm}",
            name = self.name,
            memory = self.memory_mib,
            kernel = crate::GUEST_KERNEL,
            ramdisk = self.ramdisk,
            address = self.address,
            mac = stable_mac(&self.name),
            vdev = domus::OPENCL_DISK_VDEV,
            disk = domus::OPENCL_DISK,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_keep_their_mac_addresses() {
        let a = stable_mac("crane-proxy");
        assert_eq!(a, stable_mac("crane-proxy"));
        assert_ne!(a, stable_mac("gpuguest"));
        let bytes: Vec<u8> = a
            .split(':')
            .map(|x| u8::from_str_radix(x, 16).unwrap())
            .collect();
        assert_eq!(&bytes[..3], &[0x00, 0x16, 0x3e]);
        assert!(bytes[3] < 0x80);
        let cfg = DomuConfig {
            name: "crane-proxy".into(),
            kind: DomainKind::Pv,
            address: "10.77.0.2/24".into(),
            memory_mib: 384,
            ramdisk: "/x".into(),
        }
        .render();
        assert!(cfg.contains(&format!("mac={a}\"")), "{cfg}");
    }

    #[test]
    fn parses_xl_list_lspci_and_ping() {
        let list = "Name                                        ID   Mem VCPUs\tState\tTime(s)\n\
                    Domain-0                                     0  1024     2     r-----      97.3\n\
                    hvmguest                                     2   255     1     r-----       1.5\n";
        let parsed = parse_xl_list(list);
        assert_eq!(parsed.len(), 2);
        assert_eq!(find_domain(&parsed, "hvmguest").unwrap().id, 2);
        assert_eq!(find_domain(&parsed, "Domain-0").unwrap().memory_mib, 1024);
        let lspci = "00:02.0 ff80: 5853:0001 (rev 01)\n00:03.0 0200: 8086:100e (rev 03)\n";
        assert_eq!(standin_slot(lspci).as_deref(), Some("00:03.0"));
        assert_eq!(standin_slot("00:02.0 ff80: 5853:0001 (rev 01)\n"), None);
        let ping = "PING 10.77.0.2 (10.77.0.2): 56 data bytes\n\n--- 10.77.0.2 ping statistics ---\n\
                    3 packets transmitted, 2 packets received, 33% packet loss\n";
        assert_eq!(parse_ping_received(ping), Some(2));
        assert_eq!(
            parse_ping_received("ping: sendto: Network unreachable\n"),
            None
        );
    }

    #[test]
    fn renders_pv_and_hvm_configs() {
        let mut config = DomuConfig {
            name: "g".into(),
            kind: DomainKind::Hvm,
            address: "10.0.0.1/24".into(),
            memory_mib: 256,
            ramdisk: "/guest/x.cpio.gz".into(),
        };
        let hvm = config.render();
        assert!(hvm.contains("type = \"hvm\""));
        assert!(hvm.contains("device_model_override"));
        assert!(hvm.contains("ramdisk = \"/guest/x.cpio.gz\""));
        assert!(hvm.contains("vdev=xvde,access=ro"), "{hvm}");
        assert!(hvm.contains("crane.ip=10.0.0.1/24"));
        config.kind = DomainKind::Pv;
        let pv = config.render();
        assert!(pv.contains("type = \"pv\""));
        assert!(!pv.contains("device_model_override"));
    }
}
