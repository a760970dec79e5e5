//! `cargo xtask demo` runs this (root): see `tests::demo`.

fn main() {
    tests::demo::run(&mut |line| println!("{line}"));
}
