"""What an image holds, recorded: its Debian packages beside the lock (``debs``) and a CycloneDX
bill of materials per target (``cyclonedx``). docs/sbom.md."""
