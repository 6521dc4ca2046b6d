"""The lean wire path: storage calls as the SDKs send them, without their model layer."""
