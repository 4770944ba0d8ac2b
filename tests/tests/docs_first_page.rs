//! The first page and the pages it points to say what the code does (issue 36): both
//! mechanisms in the README's first screen, every flag `demo --help` prints in the README's
//! flag list and in docs/loops.md's table, every subcommand of `plexsphere-leader --help` in
//! the CLI's README and in the root README's layout table, and every README `main` printing
//! its error by `Display` (a `main` returning `Result` prints `Debug`). A flag, a subcommand or
//! an example changed without its docs fails here.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed unwrap is a failed test"
)]

mod loops_support;

use loops_support::demo_binary;

const README: &str = include_str!("../../README.md");
const LOOPS: &str = include_str!("../../docs/loops.md");
const CLI_README: &str = include_str!("../../adapters/cli/README.md");
const ELECTOR_README: &str = include_str!("../../adapters/elector/README.md");
const SQLX_README: &str = include_str!("../../adapters/sqlx/README.md");

/// The long options a `--help` text lists (`--name`), `--help` and `--version` left out.
fn long_options(help: &str) -> Vec<String> {
    let mut options: Vec<String> = help
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line
                .strip_prefix('-')
                .filter(|rest| !rest.starts_with('-'))
                .map_or(line, |rest| rest.get(3..).unwrap_or_default());
            let name = line.strip_prefix("--")?;
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .filter(|name| name != "help" && name != "version")
        .collect();
    options.dedup();
    options
}

/// The subcommands of a clap `--help` text: the names under `Commands:`, `help` left out.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_names_both_mechanisms_in_its_first_screen() {
    let first_screen: String = README.lines().take(30).collect::<Vec<_>>().join("\n");
    for needed in [
        "advisory lock",
        "Config::lease",
        "transaction",
        "lease::setup",
    ] {
        assert!(
            first_screen.contains(needed),
            "the README's first 30 lines do not say {needed:?}:\n{first_screen}"
        );
    }
    for stale in [
        "cannot carry the lock at all",
        "through a PostgreSQL session advisory lock, and",
    ] {
        assert!(!README.contains(stale), "the README still says {stale:?}");
    }
    for (name, page) in [
        ("adapters/elector/README.md", ELECTOR_README),
        ("adapters/sqlx/README.md", SQLX_README),
    ] {
        assert!(page.contains("lease"), "{name} does not name the lease");
    }
}

#[test]
fn every_readme_main_prints_its_error_by_display() {
    let mut mains = 0;
    for (name, page) in [
        ("README.md", README),
        ("adapters/sqlx/README.md", SQLX_README),
    ] {
        for block in page.split("```rust").skip(1) {
            let code = block.split("```").next().unwrap_or_default();
            if !code.contains("fn main") {
                continue;
            }
            mains += 1;
            assert!(
                !code.contains("fn main() -> Result"),
                "{name}: a `main` returning `Result` prints its error with `Debug`:\n{code}"
            );
        }
    }
    assert!(mains >= 3, "the README's two examples and sqlx's: {mains}");
    assert!(
        README.contains(".lease(Duration::ZERO)") && README.contains("lease::setup(&pool"),
        "the README has a complete lease example"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_demo_flag_is_in_the_readme_and_in_the_loops_page() {
    let output = tokio::process::Command::new(demo_binary().await)
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    let flags = long_options(&help);
    assert!(flags.len() >= 10, "{flags:?} from:\n{help}");
    let loops_table: Vec<&str> = LOOPS
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .collect();
    for flag in &flags {
        assert!(
            README.contains(&format!("`--{flag}")),
            "README.md's flag list lacks --{flag}"
        );
        assert!(
            loops_table
                .iter()
                .any(|row| row.starts_with(&format!("| `--{flag}"))),
            "docs/loops.md's flag table lacks --{flag}"
        );
    }
    // And no row for a flag the demo does not have.
    for row in loops_table {
        let flag = row
            .trim_start_matches("| `--")
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .next()
            .unwrap_or_default();
        assert!(
            flags.iter().any(|f| f == flag),
            "docs/loops.md documents --{flag}, which the demo lacks"
        );
    }
}

#[tokio::test]
async fn every_cli_subcommand_is_in_the_cli_readme_and_the_layout_table() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code =
        plexsphere_leader_cli::run(["plexsphere-leader", "--help"], &mut out, &mut err).await;
    assert_eq!(code, 0);
    let help = String::from_utf8(out).unwrap();
    let commands = subcommands(&help);
    assert!(commands.len() >= 3, "{commands:?} from:\n{help}");
    let layout = README
        .lines()
        .find(|line| line.starts_with("| `adapters/cli/`"))
        .unwrap();
    for command in &commands {
        assert!(
            CLI_README.contains(&format!("plexsphere-leader {command}")),
            "adapters/cli/README.md lacks `plexsphere-leader {command}`"
        );
        assert!(
            layout.contains(&format!("plexsphere-leader {command}")),
            "README.md's layout row lacks `plexsphere-leader {command}`: {layout}"
        );
    }
}

#[test]
fn help_texts_parse_as_expected() {
    let help = "Options:\n      --replicas <REPLICAS>\n  -h, --help\n      --check-interval <X>\n  -V, --version\n";
    assert_eq!(long_options(help), ["replicas", "check-interval"]);
    let commands =
        "Usage: x\n\nCommands:\n  status  Print\n  lease   Print\n  help    Print\n\nOptions:\n";
    assert_eq!(subcommands(commands), ["status", "lease"]);
}
