//! A replica in its own OS process (one elector; with `--shards K` a sharded elector), for the
//! fault-injection suite: see `plexsphere_leader_tests::replica_child` for its arguments,
//! commands and output.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    plexsphere_leader_tests::replica_child::main(std::env::args().skip(1))
}
