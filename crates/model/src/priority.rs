//! Scheduling priority of background threads (the trainer's, the adapter loader's): at a higher
//! niceness than the engine's threads, the kernel's scheduler gives the engine the cores whenever
//! it wants them and the background work the rest.

/// Sets the calling thread's niceness (Linux sets it per thread); elsewhere does nothing.
pub fn set_this_thread(nice: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice)?;
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
    Ok(())
}

/// The calling thread's niceness (0 where it cannot be read per thread).
pub fn of_this_thread() -> std::io::Result<i32> {
    #[cfg(target_os = "linux")]
    return Ok(rustix::process::getpriority_process(Some(rustix::thread::gettid()))?);
    #[cfg(not(target_os = "linux"))]
    Ok(0)
}
