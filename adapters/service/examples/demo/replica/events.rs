//! The demo's event lines: one stdout line per leadership change of this replica, and
//! its logs on stderr, each line prefixed with the replica.

use super::*;

/// Prints one line per leadership change of this replica (stdout, one `write` per line), from
/// the elector's published leadership: no polling, and the typed cause of each term's end.
pub(super) async fn print_leadership(elector: Elector, me: Me, watch: CancellationToken) {
    let mut published = elector.subscribe();
    let mut events = Printed::default();
    loop {
        let leadership = *published.borrow_and_update();
        print_events(&me, &mut events, &leadership);
        tokio::select! {
            () = watch.cancelled() => break,
            changed = published.changed() => if changed.is_err() { break },
        }
    }
    // What the stop published before the watch ended (the release).
    print_events(&me, &mut events, &elector.leadership());
}

/// What [`print_events`] already printed.
#[derive(Default)]
struct Printed {
    terms: TermEvents,
    release: Option<TermId>,
}

/// Prints the term begins and ends `leadership` implies, then the release of a stopped term
/// once the elector knows what the unlock did: `event=released` when the server released it,
/// else `event=release-failed` with the outcome (the lock may be left for the server to free).
fn print_events(me: &Me, printed: &mut Printed, leadership: &Leadership) {
    for event in printed.terms.read(leadership) {
        let text = match event {
            TermEvent::Began(term) => match &me.version {
                Some(version) => format!("event=acquired term={} version={version}", term.id),
                None => format!("event=acquired term={}", term.id),
            },
            // The stop's line waits for its release below.
            TermEvent::Ended(TermEnd {
                cause: TermEndCause::Stopped,
                ..
            }) => continue,
            TermEvent::Ended(end) => match end.cause {
                TermEndCause::Resigned => {
                    format!(
                        "event=resigned term={} cause=\"leadership resigned\"",
                        end.id
                    )
                }
                TermEndCause::Yielded => format!(
                    "event=yielded term={} cause={:?}",
                    end.id,
                    end.cause.to_string()
                ),
                TermEndCause::Lost(reason) => format!(
                    "event=lost term={} reason={} cause={:?}",
                    end.id,
                    reason.label(),
                    end.cause.to_string()
                ),
                other => format!("event=ended term={} cause={:?}", end.id, other.to_string()),
            },
            TermEvent::EndMissed(id) => format!("event=ended term={id} cause=\"not seen\""),
            other => format!("event=term-event detail={other:?}"),
        };
        line(me, &text);
    }
    let stopped = leadership
        .last_end()
        .filter(|end| end.cause == TermEndCause::Stopped);
    let release = leadership
        .last_release()
        .filter(|release| stopped.is_some_and(|end| end.id == release.term))
        .filter(|release| printed.release != Some(release.term));
    if let Some(release) = release {
        printed.release = Some(release.term);
        line(me, &release_line(release));
    }
}

/// The line of a stopped term's release.
fn release_line(release: Release) -> String {
    if release.outcome == ReleaseOutcome::Released {
        return format!(
            "event=released term={} cause=\"election stopped: {}\"",
            release.term, release.outcome
        );
    }
    format!(
        "event=release-failed term={} outcome={} cause=\"election stopped: {}\"",
        release.term,
        release.outcome.label(),
        release.outcome
    )
}

pub(super) fn line(me: &Me, event: &str) {
    let text = format!("[demo] replica={} pid={} {event}\n", me.index, me.pid);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Logs to stderr, each line prefixed with `replica <i> | `; `RUST_LOG` overrides the default
/// filter (`warn`).
pub(super) fn init_logs(index: u16) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(Prefixed(format!("replica {index} | ")))
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let _ = tracing_subscriber::registry().with(fmt).try_init();
}

struct Prefixed(String);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Prefixed {
    type Writer = PrefixedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        PrefixedWriter {
            buf: self.0.clone().into_bytes(),
        }
    }
}

/// Collects one event, then writes it to stderr with one `write` when dropped.
struct PrefixedWriter {
    buf: Vec<u8>,
}

impl std::io::Write for PrefixedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for PrefixedWriter {
    fn drop(&mut self) {
        let _ = std::io::stderr().lock().write_all(&self.buf);
    }
}
