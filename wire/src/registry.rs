//! [`command_registry!`]: a server's commands declared once, as an enum with its names.
//!
//! The router and the shard each declare their commands with it; everything else a command is
//! (how it runs, parses, is authorised, meets a transaction) is an exhaustive `match` on the
//! enum beside the code that uses it, so a command added to the list fails to compile until
//! every such place has classified it.

/// Declares `pub enum Command`, `Command::ALL`, `Command::listed_names` and `Command::named`
/// from one list, each entry `Variant: "listed", ... / "alias", ...;` (the names
/// `listCommands` shows, then the other names that denote it; either list may be empty).
#[macro_export]
macro_rules! command_registry {
    ($($variant:ident: $($listed:literal),* $(/ $($alias:literal),+)?;)+) => {
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

            /// The command a name denotes, listed name or alias.
            pub fn named(name: &str) -> Option<Command> {
                match name {
                    $($($listed)|* $($(| $alias)+)? => Some(Command::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
