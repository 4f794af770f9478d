// Keeps target source lists non-empty while folders are being filled; compiles to nothing.
