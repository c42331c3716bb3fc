//! Which process serves a URL on this machine, so NVML's per-process figure (`--pid`) can be
//! found without the user naming it. Linux only, best effort: `/proc/net/tcp*` gives the
//! listening socket's inode, `/proc/*/fd` the process that holds it.

/// The process listening on the URL's port, when the URL's host is this machine (Linux:
/// the socket's inode in /proc/net/tcp*, then the process holding it). Best effort: `None`
/// when anything is not as expected.
pub fn listener_pid(url: &str) -> Option<u32> {
    let t = crate::http::client::resolve(url).ok()?;
    let addr = t.addrs.first()?;
    if !addr.ip().is_loopback() {
        return None;
    }
    let port = addr.port();
    let mut inodes = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(s) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in s.lines().skip(1) {
            let v: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT; state 0A is LISTEN.
            let (Some(local), Some(state), Some(inode)) = (v.get(1), v.get(3), v.get(9)) else {
                continue;
            };
            let p = local
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if p == Some(port) && *state == "0A" {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(l) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| l.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}
