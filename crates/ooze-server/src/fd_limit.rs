//! The process's open-file limit. Every connection is a file descriptor; with the common default
//! soft limit of 1,024 a burst of connections makes `accept` fail with EMFILE long before the
//! connection cap is reached, and the server stops answering even `/health`. The soft limit may be
//! raised up to the hard limit without privileges, so a server raises it at start.

fn get() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

fn set(limit: &libc::rlimit) -> std::io::Result<()> {
    // SAFETY: setrlimit reads one rlimit through a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, limit) } != 0 {
        let err = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            err.kind(),
            format!(
                "setting the open-file limit to {} (hard {}): {err}",
                limit.rlim_cur, limit.rlim_max
            ),
        ));
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let limit = get()?;
    if limit.rlim_cur < limit.rlim_max {
        set(&libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        })?;
    }
    open_file_limit()
}

/// The soft `RLIMIT_NOFILE` now in force.
pub fn open_file_limit() -> std::io::Result<u64> {
    Ok(get()?.rlim_cur as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_rises_to_the_hard_limit() {
        let hard = get().unwrap().rlim_max;
        set(&libc::rlimit {
            rlim_cur: hard.min(512),
            rlim_max: hard,
        })
        .unwrap();
        assert_eq!(open_file_limit().unwrap(), hard.min(512) as u64);
        assert_eq!(raise_open_file_limit().unwrap(), hard as u64);
        let now = get().unwrap();
        assert_eq!((now.rlim_cur, now.rlim_max), (hard, hard));
    }
}
