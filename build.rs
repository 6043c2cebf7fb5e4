//! Rebuilds when a migration is added, since `sqlx::migrate!` embeds the folders at compile time.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
