use super::*;

/// The reserved slot keeps an eighth of the files left once the agent's own are open: of the
/// whole limit, a limit of 100 with 72 open left 12 slots for 28 free files.
#[test]
fn the_reserved_slot_leaves_the_agent_most_of_the_files_it_has_left() {
    assert_eq!(reserved_cap(Some(1024), 72), 119);
    assert_eq!(reserved_cap(Some(100), 72), 3);
    assert_eq!(reserved_cap(Some(50), 72), 1, "at least one, for `off`");
    assert_eq!(reserved_cap(None, 72), MAX_RESERVED, "no limit");
    assert_eq!(reserved_cap(Some(1 << 40), 0), MAX_RESERVED);
}
