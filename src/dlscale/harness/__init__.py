"""The one harness: device choice, timing, statistics, recording and failure handling."""
