//! The SSRF guard of `web_fetch`: which addresses it refuses, the resolver that hands the HTTP
//! client only checked addresses, and the redirect policy that checks every hop.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::{Attempt, Policy};
use reqwest::{ClientBuilder, Url};

use super::{MAX_REDIRECTS, host_addresses};
use crate::tools::ToolError;

/// Cloud metadata endpoints; inside the link-local and unique-local ranges already, listed on
/// their own so the intent survives any change to those ranges.
const METADATA_ADDRESSES: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)),
];

/// Whether `web_fetch` must refuse to connect to `ip` (unless private addresses are allowed):
/// loopback, private, link-local, unspecified, broadcast, multicast, reserved, CGNAT,
/// documentation (TEST-NET) and metadata addresses, including every IPv6 form that embeds such
/// an IPv4 address. The host's own interface addresses are refused too, by the guard, since
/// they are known only at run time.
pub fn is_forbidden(ip: IpAddr) -> bool {
    if METADATA_ADDRESSES.contains(&ip) {
        return true;
    }
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // 0.0.0.0/8, "this network", includes the unspecified address
        || ip.is_loopback() // 127.0.0.0/8
        || ip.is_private() // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local() // 169.254/16, includes 169.254.169.254
        || (a == 100 && (b & 0xc0) == 64) // 100.64/10, carrier-grade NAT
        || (a == 192 && b == 0 && c == 0) // 192.0.0.0/24, IETF protocol assignments
        // TEST-NET-1, -2 and -3: documentation only, so never a real site, yet a host may
        // carry one on an interface (and then they reach its own services).
        || (a == 192 && b == 0 && c == 2) // 192.0.2.0/24
        || (a == 198 && b == 51 && c == 100) // 198.51.100.0/24
        || (a == 203 && b == 0 && c == 113) // 203.0.113.0/24
        || (a == 198 && (b & 0xfe) == 18) // 198.18/15, benchmarking
        || ip.is_multicast() // 224/4
        || a >= 240 // 240/4 reserved, includes 255.255.255.255
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    if let Some(v4) = embedded_v4(ip) {
        return forbidden_v4(v4);
    }
    let seg = ip.segments();
    (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1) // 64:ff9b:1::/48, local-use NAT64
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // 2001:db8::/32, documentation
        || (seg[0] & 0xfe00) == 0xfc00 // fc00::/7 unique local, includes fd00:ec2::254
        || (seg[0] & 0xffc0) == 0xfe80 // fe80::/10 link-local
        || (seg[0] & 0xffc0) == 0xfec0 // fec0::/10 deprecated site-local
        || (seg[0] & 0xff00) == 0xff00 // ff00::/8 multicast
}

/// The IPv4 address an IPv6 address stands for, in the forms that reach an IPv4 host: mapped
/// `::ffff:a.b.c.d`, SIIT-translated `::ffff:0:a.b.c.d`, compatible `::a.b.c.d` (deprecated),
/// NAT64 `64:ff9b::a.b.c.d` and 6to4 `2002:aabb:ccdd::/48`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let low = Ipv4Addr::from((u32::from(seg[6]) << 16) | u32::from(seg[7]));
    match seg {
        [0, 0, 0, 0, 0, 0xffff, _, _] // ::ffff:0:0/96
        | [0, 0, 0, 0, 0xffff, 0, _, _] // ::ffff:0:0:0/96
        | [0, 0, 0, 0, 0, 0, _, _] // ::/96
        | [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low), // 64:ff9b::/96
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))),
        _ => None,
    }
}

/// Whether `ip`, or the IPv4 address it embeds, is one of `host` (the interface addresses).
fn is_host_address(ip: IpAddr, host: &[IpAddr]) -> bool {
    let embedded = match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    host.iter().any(|own| *own == ip || Some(*own) == embedded)
}

/// Why a URL or an address was refused before any request went out.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Not http or https.
    Scheme(String),
    /// A forbidden address, with the host it came from.
    Address { ip: IpAddr, host: String },
    /// An address of one of this host's own interfaces, with the host it came from.
    OwnAddress { ip: IpAddr, host: String },
    /// The interface addresses could not be listed, so nothing could be checked against them.
    OwnAddressesUnknown(String),
    /// A host name that resolved to no address at all.
    NoAddress(String),
    /// More redirect hops than allowed.
    TooManyRedirects,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scheme(scheme) => write!(
                f,
                "web_fetch only fetches http and https URLs, not `{scheme}:`"
            ),
            Self::Address { ip, host } if host == &ip.to_string() => write!(
                f,
                "refused to connect to {ip}: loopback, private, link-local, reserved, \
                 documentation and cloud metadata addresses are blocked"
            ),
            Self::Address { ip, host } => write!(
                f,
                "refused to connect to {ip} (the address of {host}): loopback, private, \
                 link-local, reserved, documentation and cloud metadata addresses are blocked"
            ),
            Self::OwnAddress { ip, host } if host == &ip.to_string() => write!(
                f,
                "refused to connect to {ip}: it is an address of this server's own network \
                 interfaces"
            ),
            Self::OwnAddress { ip, host } => write!(
                f,
                "refused to connect to {ip} (the address of {host}): it is an address of this \
                 server's own network interfaces"
            ),
            Self::OwnAddressesUnknown(why) => write!(
                f,
                "refused to connect: this server's own addresses could not be listed ({why}), \
                 so the address could not be checked against them"
            ),
            Self::NoAddress(host) => write!(f, "{host} resolved to no address"),
            Self::TooManyRedirects => {
                write!(
                    f,
                    "more than {MAX_REDIRECTS} redirects; stopped following them"
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    fn kind(&self) -> &'static str {
        match self {
            Self::Scheme(_) => "invalid_input",
            Self::Address { .. } | Self::OwnAddress { .. } | Self::OwnAddressesUnknown(_) => {
                "forbidden_address"
            }
            Self::NoAddress(_) => "network_error",
            Self::TooManyRedirects => "limit_reached",
        }
    }

    pub(super) fn to_tool_error(&self, tool: &str) -> ToolError {
        ToolError::model(self.kind(), format!("{tool}: {self}"))
    }
}

/// Which addresses one `WebFetch` may connect to.
#[derive(Debug, Clone, Default)]
pub(super) struct AddressGuard {
    /// Skips every address check (`web_fetch_allow_private`).
    pub(super) allow_private: bool,
    /// Literal-IP URLs with exactly this address and port pass even when forbidden; lets tests
    /// reach one loopback server while every other check stays on.
    pub(super) allow_exact: Vec<SocketAddr>,
    /// Stands in for the host's interface addresses when set; lets tests name a public one.
    pub(super) host_addresses: Option<Vec<IpAddr>>,
}

impl AddressGuard {
    /// The host's interface addresses as they are now (or the test's stand-in).
    fn own_addresses(&self) -> Result<Vec<IpAddr>, Refusal> {
        match &self.host_addresses {
            Some(fixed) => Ok(fixed.clone()),
            None => host_addresses::interface_addresses()
                .map_err(|err| Refusal::OwnAddressesUnknown(err.to_string())),
        }
    }

    /// Refuses `ip` (reached through `host`) when it is forbidden or one of `own`.
    fn check_address(&self, ip: IpAddr, host: &str, own: &[IpAddr]) -> Result<(), Refusal> {
        let host = host.to_owned();
        if self.allow_private {
            Ok(())
        } else if is_forbidden(ip) {
            Err(Refusal::Address { ip, host })
        } else if is_host_address(ip, own) {
            Err(Refusal::OwnAddress { ip, host })
        } else {
            Ok(())
        }
    }

    /// Checks the scheme, and the address when the host is a literal IP (those never reach the
    /// resolver); host names are checked by `GuardedResolver` when they are resolved.
    pub(super) fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::Scheme(url.scheme().to_owned()));
        }
        let Some(ip) = literal_ip(url) else {
            return Ok(());
        };
        let port = url.port_or_known_default().unwrap_or(0);
        if self.allow_private || self.allow_exact.contains(&SocketAddr::new(ip, port)) {
            return Ok(());
        }
        self.check_address(ip, &ip.to_string(), &self.own_addresses()?)
    }
}

/// The host of `url` when it is an IP address rather than a name; the URL parser has already
/// normalised odd IPv4 spellings (`0x7f.1`, `2130706433`) to dotted form.
fn literal_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    host.parse().ok()
}

/// Resolves host names with the system resolver and passes on only the addresses the guard
/// allows; the client connects to nothing else, so what was checked is what is reached.
struct GuardedResolver {
    guard: Arc<AddressGuard>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = Arc::clone(&self.guard);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let boxed =
                |refusal: Refusal| Box::new(refusal) as Box<dyn std::error::Error + Send + Sync>;
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // The resolver does not know the port, so the exact allowances (which are per
            // address and port) do not apply to names.
            let own = if guard.allow_private {
                Vec::new()
            } else {
                guard.own_addresses().map_err(boxed)?
            };
            let mut allowed = Vec::new();
            let mut first_refusal = None;
            for addr in resolved {
                match guard.check_address(addr.ip(), &host, &own) {
                    Ok(()) => allowed.push(addr),
                    Err(refusal) => {
                        first_refusal.get_or_insert(refusal);
                    }
                }
            }
            if allowed.is_empty() {
                return Err(boxed(first_refusal.unwrap_or(Refusal::NoAddress(host))));
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Finds a refusal of ours anywhere in an error's chain of causes.
pub(super) fn find_refusal<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refusal> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(refusal) = err.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        current = err.source();
    }
    None
}

/// Routes a client's connections through `guard`: no proxy, only the addresses the guard
/// allows from the resolver, and every redirect hop checked before it is followed.
pub(super) fn guarded(builder: ClientBuilder, guard: Arc<AddressGuard>) -> ClientBuilder {
    let hop_guard = Arc::clone(&guard);
    builder
        // A proxy would connect on our behalf to addresses we never checked.
        .no_proxy()
        .dns_resolver(GuardedResolver { guard })
        .redirect(Policy::custom(move |attempt: Attempt| {
            // `previous` starts with the original URL, so its length is the hop count.
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(Refusal::TooManyRedirects);
            }
            match hop_guard.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refusal) => attempt.error(refusal),
            }
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_address_table() {
        let cases: &[(&str, bool)] = &[
            ("127.0.0.1", true),
            ("127.255.0.9", true),
            ("10.1.2.3", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("172.32.0.1", false),
            ("192.168.1.1", true),
            ("169.254.169.254", true),
            ("169.254.10.10", true),
            ("100.64.0.1", true),
            ("100.127.255.255", true),
            ("100.128.0.1", false),
            ("0.0.0.0", true),
            ("0.1.2.3", true),
            ("255.255.255.255", true),
            ("224.0.0.1", true),
            ("8.8.8.8", false),
            ("93.184.215.14", false),
            ("::1", true),
            ("::", true),
            ("fc00::1", true),
            ("fd00:ec2::254", true),
            ("fe80::1", true),
            ("febf::1", true),
            ("ff02::1", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.0.0.1", true),
            ("::ffff:169.254.169.254", true),
            ("::ffff:8.8.8.8", false),
            ("::127.0.0.1", true),
            ("64:ff9b::a00:1", true),
            ("64:ff9b::808:808", false),
            ("2002:7f00:1::", true),
            ("2002:808:808::", false),
            ("2001:4860:4860::8888", false),
            ("2606:4700::1111", false),
            // TEST-NET-1, -2, -3 and their edges.
            ("192.0.2.0", true),
            ("192.0.2.2", true),
            ("192.0.2.255", true),
            ("192.0.3.1", false),
            ("192.0.1.255", false),
            ("198.51.100.7", true),
            ("198.51.101.1", false),
            ("198.51.99.1", false),
            ("203.0.113.9", true),
            ("203.0.114.1", false),
            ("203.0.112.1", false),
            ("2001:db8::1", true),
            ("2001:db9::1", false),
            // IPv4-translated (SIIT) ::ffff:0:0/96.
            ("::ffff:0:127.0.0.1", true),
            ("::ffff:0:10.0.0.1", true),
            ("::ffff:0:192.0.2.2", true),
            ("::ffff:0:8.8.8.8", false),
            // Every embedding of a TEST-NET address.
            ("::ffff:192.0.2.2", true),
            ("::192.0.2.2", true),
            ("64:ff9b::c000:202", true),
            ("64:ff9b::cb00:7101", true),
            ("64:ff9b::c633:6401", true),
            ("2002:c000:202::", true),
            ("::ffff:203.0.113.1", true),
            ("::ffff:198.51.100.1", true),
        ];
        for (text, forbidden) in cases {
            let ip: IpAddr = text.parse().expect("test address parses");
            assert_eq!(is_forbidden(ip), *forbidden, "is_forbidden({text})");
        }
    }

    /// The IPv6 forms an IPv4 address can take to reach it.
    fn embeddings(v4: Ipv4Addr) -> Vec<IpAddr> {
        let [a, b, c, d] = v4.octets();
        let (hi, lo) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
        vec![
            IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1)),
        ]
    }

    #[test]
    fn a_host_address_is_refused_in_every_form_whatever_its_range() {
        let public = Ipv4Addr::new(8, 8, 8, 8);
        let public_v6: IpAddr = "2606:4700::1111".parse().unwrap();
        let guard = AddressGuard {
            host_addresses: Some(vec![IpAddr::V4(public), public_v6]),
            ..AddressGuard::default()
        };
        let mut refused = embeddings(public);
        refused.extend([IpAddr::V4(public), public_v6]);
        for ip in refused {
            let url = Url::parse(&format!("http://{}/", SocketAddr::new(ip, 80))).unwrap();
            match guard.check_url(&url) {
                Err(refusal @ Refusal::OwnAddress { .. }) => {
                    assert_eq!(refusal.kind(), "forbidden_address");
                    assert!(refusal.to_string().contains("own network interfaces"));
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        for ip in ["8.8.4.4", "::ffff:8.8.4.4", "2606:4700::1001"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(
                guard.check_address(ip, "x", &[public.into()]).is_ok(),
                "{ip}"
            );
        }
        let allowing = AddressGuard {
            allow_private: true,
            ..guard
        };
        let url = Url::parse("http://8.8.8.8/").unwrap();
        assert!(allowing.check_url(&url).is_ok());
    }

    #[test]
    fn every_address_of_this_machine_is_refused_in_every_form() {
        let own = host_addresses::interface_addresses().unwrap();
        assert!(!own.is_empty());
        let guard = AddressGuard::default();
        for ip in &own {
            let mut forms = vec![*ip];
            if let IpAddr::V4(v4) = ip {
                forms.extend(embeddings(*v4));
            }
            for form in forms {
                assert!(
                    guard.check_address(form, "x", &own).is_err(),
                    "{form} (of {ip})"
                );
            }
        }
    }
}
