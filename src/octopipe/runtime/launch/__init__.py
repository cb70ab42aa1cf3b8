"""Processes: spawned ranks or torchrun (`launcher`, `spawn`), each rank's tie to its launcher
(`lifeline`), the settings refused before any rank starts (`preflight`). Measures no profile."""

MUST_NOT_IMPORT = ("measure",)
