//! The addresses configured on this host's network interfaces, which `web_fetch` refuses
//! whatever range they are in: a service listening on all interfaces answers on each of them,
//! so an interface address in a public or documentation range reaches it as loopback would.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every IPv4 and IPv6 address on every interface, read afresh (interfaces come and go).
pub(super) fn interface_addresses() -> io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs only writes the list head; on success we own the list until the
    // guard below hands it to freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let list = List(head);
    let mut out = Vec::new();
    let mut node = list.0;
    while !node.is_null() {
        // SAFETY: `node` is a non-null entry of the list getifaddrs returned, alive until
        // `list` is dropped at the end of this function.
        let entry = unsafe { &*node };
        // SAFETY: ifa_addr is null or points at a sockaddr of the family it names.
        if let Some(ip) = unsafe { sockaddr_ip(entry.ifa_addr) } {
            out.push(ip);
        }
        node = entry.ifa_next;
    }
    Ok(out)
}

/// Frees the list getifaddrs made, however the walk over it ends.
struct List(*mut libc::ifaddrs);

impl Drop for List {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful getifaddrs and is freed exactly once.
        unsafe { libc::freeifaddrs(self.0) }
    }
}

/// The IP address in a socket address, when it is IPv4 or IPv6.
///
/// # Safety
/// `addr` must be null or point at a valid socket address of the family in its `sa_family`.
unsafe fn sockaddr_ip(addr: *const libc::sockaddr) -> Option<IpAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per this function's contract; read unaligned because the
    // C library owes no alignment beyond sockaddr's own.
    match i32::from(unsafe { std::ptr::read_unaligned(addr) }.sa_family) {
        libc::AF_INET => {
            // SAFETY: AF_INET means the storage is a sockaddr_in.
            let v4 = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6 means the storage is a sockaddr_in6.
            let v6 = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_loopback_addresses_and_what_the_kernel_reports() {
        let listed = interface_addresses().unwrap();
        assert!(
            listed.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST))
                || listed.contains(&IpAddr::V6(Ipv6Addr::LOCALHOST)),
            "{listed:?}"
        );
        // Every IPv4 address the kernel lists as local to this host is among them.
        let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
        let lines: Vec<&str> = trie.lines().collect();
        for pair in lines.windows(2) {
            if pair[1].trim() == "/32 host LOCAL" {
                let ip: Ipv4Addr = pair[0].trim().trim_start_matches("|-- ").parse().unwrap();
                if ip.octets()[0] != 127 {
                    assert!(listed.contains(&IpAddr::V4(ip)), "{ip} in {listed:?}");
                }
            }
        }
    }
}
