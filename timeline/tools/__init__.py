"""Operations tooling: ``make run``'s stack, the embedded Azurite and the admin command line."""
