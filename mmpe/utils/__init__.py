from .atomic_files import atomic_write, is_temporary_name
from .config_checks import (DataNotFoundError, check_data_paths,
                            check_work_dir, fix_worker_settings,
                            missing_data_files)
from .launch import finalize_distributed, prepare_cpu_distributed
from .version_check import SUPPORTED, check_versions, installed_versions

__all__ = [
    'DataNotFoundError', 'SUPPORTED', 'atomic_write', 'check_data_paths',
    'check_versions', 'check_work_dir', 'finalize_distributed',
    'fix_worker_settings', 'installed_versions', 'is_temporary_name',
    'missing_data_files', 'prepare_cpu_distributed'
]
