"""Where the export's table lives: `tank_log.lakehouse.location` (the one home of `TableLocation`), by its old name."""

from tank_log.lakehouse.location import StoredFile, TableLocation

__all__ = ["StoredFile", "TableLocation"]
