"""Operations tooling: ``make run``'s stack and the admin command line."""
