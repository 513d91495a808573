from .config_checks import (DataNotFoundError, check_data_paths,
                            check_work_dir, fix_worker_settings,
                            missing_data_files)
from .launch import finalize_distributed, prepare_cpu_distributed

__all__ = [
    'DataNotFoundError', 'check_data_paths', 'check_work_dir',
    'finalize_distributed', 'fix_worker_settings', 'missing_data_files',
    'prepare_cpu_distributed'
]
