//! [`command_registry!`]: a server's commands declared once, as an enum with its names and its
//! transaction rule.
//!
//! The router and the shard each declare their commands with it; everything else a command is
//! (how it runs, parses, is authorised) is an exhaustive `match` on the enum beside the code
//! that uses it, so a command added to the list fails to compile until every such place has
//! classified it.

/// Declares `pub enum Command` with `Command::ALL`, `Command::listed_names`,
/// `Command::named` and `Command::in_transaction`, from one list that starts with the type of
/// the transaction rule, then one entry per command: `Variant: "listed", ... / "alias", ...
/// => rule;` (the names `listCommands` shows, then the other names that denote it; either list
/// may be empty). It also declares a test that every name denotes its command.
#[macro_export]
macro_rules! command_registry {
    (
        in_transaction: $rule:ty;
        $($variant:ident: $($listed:literal),* $(/ $($alias:literal),+)? => $txn:expr;)+
    ) => {
        /// One command this server runs.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Command {
            $($variant),+
        }

        impl Command {
            /// Every command.
            pub const ALL: &[Command] = &[$(Command::$variant),+];

            /// The names `listCommands` shows for this command.
            pub fn listed_names(self) -> &'static [&'static str] {
                match self {
                    $(Command::$variant => &[$($listed),*]),+
                }
            }

            /// Every name that denotes this command: listed names, then aliases.
            pub fn all_names(self) -> &'static [&'static str] {
                match self {
                    $(Command::$variant => &[$($listed,)* $($($alias),+)?]),+
                }
            }

            /// The command a name denotes, listed name or alias.
            pub fn named(name: &str) -> Option<Command> {
                match name {
                    $($($listed)|* $($(| $alias)+)? => Some(Command::$variant),)+
                    _ => None,
                }
            }

            /// How the command may meet a multi-document transaction.
            pub fn in_transaction(self) -> $rule {
                match self {
                    $(Command::$variant => $txn),+
                }
            }
        }

        #[cfg(test)]
        #[test]
        fn every_name_denotes_its_command() {
            for command in Command::ALL {
                assert!(!command.all_names().is_empty(), "{command:?} has no name");
                for name in command.all_names() {
                    assert_eq!(Command::named(name), Some(*command), "{name}");
                }
            }
            assert_eq!(Command::named("noSuchCommand"), None);
        }
    };
}
